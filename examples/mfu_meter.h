/* mfu_meter.h — train_gpt's MFU against the sgemm rate sampled through the run: each stretch of
 * training time is weighed by the rate measured at its two ends, so a host that drifts does not. */
#ifndef LOOM_EXAMPLES_MFU_METER_H
#define LOOM_EXAMPLES_MFU_METER_H

#define EX_MFU_MAX_SAMPLES 4096 // rates kept for the median (the sums take every sample)

// Samples of the sgemm rate (FLOP/s) and the training time between them. A stretch of training
// between two samples counts as time x the mean of their rates: what the sgemm would have done in
// that time. MFU over the run = the FLOPs trained / the sum of those.
typedef struct ex_mfu_meter {
  double last_rate; // the latest sample (FLOP/s)
  double open_time; // training time (s) since it
  double ref_flops; // the sum over closed stretches of time x mean rate
  double rates[EX_MFU_MAX_SAMPLES];
  int samples;     // samples taken (the first EX_MFU_MAX_SAMPLES are in rates)
  double min, max; // over every sample
} ex_mfu_meter_t;

// Starts with the first sample (the rate measured at the start, > 0).
void ex_mfu_meter_start(ex_mfu_meter_t *m, double rate);

// Adds seconds of training time to the open stretch.
void ex_mfu_meter_train(ex_mfu_meter_t *m, double seconds);

// A new sample closes the open stretch. A rate <= 0 (a rank could not measure it) closes it at
// the previous sample's rate and is not counted as a sample.
void ex_mfu_meter_sample(ex_mfu_meter_t *m, double rate);

// The sgemm's FLOPs over all training time so far (an open stretch at the latest rate).
double ex_mfu_meter_ref_flops(const ex_mfu_meter_t *m);

// The median of the kept samples (FLOP/s); sorts them in place (call it once, at the end).
double ex_mfu_meter_median(ex_mfu_meter_t *m);

#endif
