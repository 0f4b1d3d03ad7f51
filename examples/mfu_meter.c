/* mfu_meter.c — train_gpt's MFU against the sgemm rate sampled through the run: sums of training
 * time weighed by the rates at each stretch's two ends, and the median of the samples. */
#include "mfu_meter.h"

#include <string.h>

#include "example_util.h"

static void keep(ex_mfu_meter_t *m, double rate) {
  if (m->samples < EX_MFU_MAX_SAMPLES) {
    m->rates[m->samples] = rate;
  }
  m->samples++;
  m->min = rate < m->min ? rate : m->min;
  m->max = rate > m->max ? rate : m->max;
}

void ex_mfu_meter_start(ex_mfu_meter_t *m, double rate) {
  memset(m, 0, sizeof *m);
  m->last_rate = m->min = m->max = rate;
  keep(m, rate);
}

void ex_mfu_meter_train(ex_mfu_meter_t *m, double seconds) {
  m->open_time += seconds;
}

void ex_mfu_meter_sample(ex_mfu_meter_t *m, double rate) {
  const double end = rate > 0.0 ? rate : m->last_rate;
  m->ref_flops += m->open_time * 0.5 * (m->last_rate + end);
  m->open_time = 0.0;
  m->last_rate = end;
  if (rate > 0.0) {
    keep(m, rate);
  }
}

double ex_mfu_meter_ref_flops(const ex_mfu_meter_t *m) {
  return m->ref_flops + m->open_time * m->last_rate;
}

double ex_mfu_meter_median(ex_mfu_meter_t *m) {
  return ex_median(m->rates, m->samples < EX_MFU_MAX_SAMPLES ? m->samples : EX_MFU_MAX_SAMPLES);
}
