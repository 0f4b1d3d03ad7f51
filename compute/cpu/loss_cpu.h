/* loss_cpu.h — raw-pointer CPU kernels of the cross-entropy loss over rows of logits, shared by
 * loom_cross_entropy_* (compute/loss.c) and any layer that fuses the loss into its own loop. */
#ifndef LOOM_CPU_LOSS_H
#define LOOM_CPU_LOSS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The number of the n targets that are not ignore_index (the divisor of the mean loss).
int64_t loom_cpu_cross_entropy_count(int64_t n, const int32_t *targets, // (n)
                                     int32_t ignore_index);

// losses[i] = logsumexp(logits[i, :]) - logits[i, targets[i]], or 0 where targets[i] is
// ignore_index. Returns the sum of the non-ignored losses, accumulated in double. Every other
// target must be in 0..v-1 (the caller checks). Stable: the row maximum is subtracted before exp.
double loom_cpu_cross_entropy_forward(int64_t n, int64_t v,
                                      const float *logits,    // (n, v)
                                      const int32_t *targets, // (n)
                                      int32_t ignore_index,
                                      float *losses); // (n)

// dlogits[i, :] = scale * (softmax(logits[i, :]) - onehot(targets[i])), 0 on ignored rows.
// scale is the gradient of each row's loss: dloss / n_valid for a mean loss. dlogits may be
// logits itself (in place, as llm.c's fused classifier does) but must not partly overlap it.
void loom_cpu_cross_entropy_backward(int64_t n, int64_t v,
                                     float *dlogits,         // (n, v)
                                     const float *logits,    // (n, v)
                                     const int32_t *targets, // (n)
                                     int32_t ignore_index, float scale);

#ifdef __cplusplus
}
#endif
#endif
