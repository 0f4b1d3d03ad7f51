/* test_binding_plan.c — the core split: every core used exactly once when ranks <= cores,
 * shares differ by at most one, and oversubscribed ranks share cores round-robin. */
#include "config.h"

#include "../check.h"
#include "topology.h"

int main(void) {
  for (int cores = 1; cores <= 64; cores++) {
    for (int ranks = 1; ranks <= 70; ranks++) {
      int used[64] = {0}, lo = 1 << 30, hi = 0;
      for (int r = 0; r < ranks; r++) {
        int first, count;
        loom_bind_plan(cores, r, ranks, &first, &count);
        CHECK(first >= 0 && count >= 1 && first + count <= cores, "c %d n %d r %d: %d+%d", cores,
              ranks, r, first, count);
        for (int c = first; c < first + count && c < 64; c++) {
          used[c]++;
        }
        lo = count < lo ? count : lo;
        hi = count > hi ? count : hi;
      }
      CHECK(hi - lo <= 1, "balanced shares for %d cores, %d ranks", cores, ranks);
      for (int c = 0; c < cores; c++) {
        int want = ranks >= cores ? ranks / cores + (c < ranks % cores) : 1;
        CHECK(used[c] == want, "core %d used %d times, want %d (cores %d ranks %d)", c, used[c],
              want, cores, ranks);
      }
    }
  }
  return check_exit("test_binding_plan");
}
