/* test_layout.c — group membership as a pure function: every rank's colors and roles for
 * np 1..8 under EP sizes and attention-server modes, and the errors for impossible settings. */
#include "config.h"

#include <string.h>

#include "../check.h"
#include "layout.h"
#include "params.h"

int main(void) {
  char err[512];
  for (int np = 1; np <= 8; np++) {
    for (int ep = 1; ep <= np; ep++) {
      const int modes[] = {0, LOOM_ATTN_INPLACE, 1, 2};
      for (int m = 0; m < 4; m++) {
        struct loom_layout_in in = {np, ep, modes[m]};
        int trainers = modes[m] > 0 ? np - modes[m] : np;
        loom_status_t st = loom_layout_check(&in, err, sizeof err);
        int valid = trainers >= 1 && trainers % ep == 0;
        CHECK((st == LOOM_OK) == valid, "np %d ep %d attn %d: %s", np, ep, modes[m], err);
        if (!valid) {
          continue;
        }
        int dp = 0, attn = 0, ep_count[64] = {0}, edp_count[64] = {0};
        for (int r = 0; r < np; r++) {
          struct loom_layout_rank lr;
          loom_layout_rank(&in, r, &lr);
          CHECK(lr.color[LOOM_GROUP_WORLD] == 0, "world");
          int trainer = r < trainers;
          CHECK(((lr.role & LOOM_ROLE_TRAINER) != 0) == trainer, "np %d r %d role", np, r);
          if (trainer) {
            dp++;
            CHECK(lr.color[LOOM_GROUP_EP] == r / ep, "ep color");
            CHECK(lr.color[LOOM_GROUP_EXPERT_DP] == r % ep, "edp color");
            ep_count[lr.color[LOOM_GROUP_EP]]++;
            edp_count[lr.color[LOOM_GROUP_EXPERT_DP]]++;
          } else {
            CHECK(lr.color[LOOM_GROUP_DP] < 0 && lr.color[LOOM_GROUP_EP] < 0, "server not in dp");
          }
          if (lr.color[LOOM_GROUP_ATTN] == 0) {
            attn++;
            CHECK(lr.role & LOOM_ROLE_ATTN_SERVER, "attn member serves");
          }
        }
        CHECK(dp == trainers, "dp size %d vs %d", dp, trainers);
        for (int g = 0; g < trainers / ep; g++) {
          CHECK(ep_count[g] == ep, "every ep group has ep ranks");
        }
        for (int g = 0; g < ep; g++) {
          CHECK(edp_count[g] == trainers / ep, "every expert_dp group has trainers/ep ranks");
        }
        int want_attn = modes[m] == 0 ? 0 : modes[m] == LOOM_ATTN_INPLACE ? np : modes[m];
        CHECK(attn == want_attn, "np %d attn mode %d: %d servers", np, modes[m], attn);
      }
    }
  }
  struct loom_layout_in bad_ep = {4, 3, 0};
  CHECK(loom_layout_check(&bad_ep, err, sizeof err) == LOOM_ERR_INVALID_ARG, "ep 3 at np 4");
  CHECK(strstr(err, "LOOM_EP_SIZE=3") && strstr(err, "1, 2, 4"), "lists divisors: %s", err);
  struct loom_layout_in bad_attn = {4, 1, 4};
  CHECK(loom_layout_check(&bad_attn, err, sizeof err) == LOOM_ERR_INVALID_ARG, "attn 4 at np 4");
  CHECK(strstr(err, "at most 3"), "says the limit: %s", err);
  return check_exit("test_layout");
}
