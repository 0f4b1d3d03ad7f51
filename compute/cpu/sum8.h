/* sum8.h — row reductions in eight double partial sums: a fixed order (deterministic, the same
 * bits whatever the vector width of the clone) that the compiler can still vectorise. */
#ifndef LOOM_SUM8_H
#define LOOM_SUM8_H

// The eight partial sums s[0..7] (s[l] holds elements l, l + 8, ...) and the tail past the last
// multiple of 8, combined in one fixed order.
static inline double sum8_finish(const double s[8], double tail) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

#endif
