/* layout.c — group membership as a pure function of world size, LOOM_EP_SIZE and
 * LOOM_ATTN_SERVERS; loom_init splits communicators with these colors, loom_info prints them. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "layout.h"
#include "params.h"

int loom_layout_trainers(const struct loom_layout_in *in) {
  return in->attn_servers > 0 ? in->world_size - in->attn_servers : in->world_size;
}

loom_status_t loom_layout_check(const struct loom_layout_in *in, char *err, size_t errlen) {
  if (in->world_size < 1) {
    snprintf(err, errlen, "world size %d: need at least one rank", in->world_size);
    return LOOM_ERR_INVALID_ARG;
  }
  if (in->attn_servers > 0 && in->attn_servers >= in->world_size) {
    snprintf(err, errlen,
             "LOOM_ATTN_SERVERS=%d (dedicated attention servers; a trainer's --attn-servers sets "
             "it) leaves no training rank at np %d: use at most %d dedicated servers, or 'inplace'",
             in->attn_servers, in->world_size, in->world_size - 1);
    return LOOM_ERR_INVALID_ARG;
  }
  int trainers = loom_layout_trainers(in);
  if (in->ep_size < 1 || trainers % in->ep_size != 0) {
    char divisors[256] = "";
    size_t o = 0;
    for (int d = 1; d <= trainers && o < sizeof divisors - 16; d++) {
      if (trainers % d == 0) {
        o += (size_t)snprintf(divisors + o, sizeof divisors - o, "%s%d", o ? ", " : "", d);
      }
    }
    snprintf(err, errlen, "LOOM_EP_SIZE=%d does not divide the %d training ranks: use one of %s",
             in->ep_size, trainers, divisors);
    return LOOM_ERR_INVALID_ARG;
  }
  return LOOM_OK;
}

void loom_layout_rank(const struct loom_layout_in *in, int rank, struct loom_layout_rank *out) {
  int trainers = loom_layout_trainers(in);
  int trainer = rank < trainers;
  for (int k = 0; k < LOOM_GROUP_COUNT; k++) {
    out->color[k] = -1;
  }
  out->color[LOOM_GROUP_WORLD] = 0;
  out->role = 0;
  if (trainer) {
    out->role |= LOOM_ROLE_TRAINER;
    out->color[LOOM_GROUP_DP] = 0;
    out->color[LOOM_GROUP_EP] = rank / in->ep_size;
    out->color[LOOM_GROUP_EXPERT_DP] = rank % in->ep_size;
  }
  if ((in->attn_servers == LOOM_ATTN_INPLACE && trainer) || (in->attn_servers > 0 && !trainer)) {
    out->role |= LOOM_ROLE_ATTN_SERVER;
    out->color[LOOM_GROUP_ATTN] = 0;
  }
}

// Members of the group of `kind` that `rank` belongs to, as "0-3" / "0,2" / "-".
static void members(const struct loom_layout_in *in, int node_size, int rank, int kind, char *buf,
                    size_t len) {
  struct loom_layout_rank me, other;
  loom_layout_rank(in, rank, &me);
  int mine = kind == LOOM_GROUP_NODE ? rank / node_size : me.color[kind];
  if (mine < 0) {
    snprintf(buf, len, "-");
    return;
  }
  int list[64] = {0}, n = 0;
  for (int r = 0; r < in->world_size && n < 64; r++) {
    loom_layout_rank(in, r, &other);
    int c = kind == LOOM_GROUP_NODE ? r / node_size : other.color[kind];
    if (c == mine) {
      list[n++] = r;
    }
  }
  if (n == 0) {
    snprintf(buf, len, "-");
    return;
  }
  int contiguous = list[n - 1] - list[0] == n - 1;
  if (contiguous && n > 1) {
    snprintf(buf, len, "%d-%d", list[0], list[n - 1]);
    return;
  }
  size_t o = 0;
  for (int i = 0; i < n && o < len; i++) {
    o += (size_t)snprintf(buf + o, len - o, "%s%d", i ? "," : "", list[i]);
  }
}

void loom_layout_print_table(FILE *out, int max_np, int node_size, int ep_size, int attn_servers) {
  static const int kinds[] = {LOOM_GROUP_NODE, LOOM_GROUP_DP, LOOM_GROUP_EP, LOOM_GROUP_EXPERT_DP,
                              LOOM_GROUP_ATTN};
  fprintf(out, "| np | rank | role | node | dp | ep | expert_dp | attn |\n");
  fprintf(out, "|---|---|---|---|---|---|---|---|\n");
  for (int np = 1; np <= max_np; np++) {
    struct loom_layout_in in = {np, ep_size, attn_servers};
    char err[256];
    if (loom_layout_check(&in, err, sizeof err) != LOOM_OK) {
      fprintf(out, "| %d | all | invalid: %s | | | | | |\n", np, err);
      continue;
    }
    int ns = node_size > 0 ? node_size : np;
    for (int r = 0; r < np; r++) {
      struct loom_layout_rank lr;
      loom_layout_rank(&in, r, &lr);
      const char *role = lr.role == (LOOM_ROLE_TRAINER | LOOM_ROLE_ATTN_SERVER) ? "train+serve"
                         : lr.role == LOOM_ROLE_TRAINER                         ? "train"
                                                                                : "serve";
      fprintf(out, "| %d | %d | %s |", np, r, role);
      for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char buf[256];
        members(&in, ns, r, kinds[k], buf, sizeof buf);
        fprintf(out, " %s |", buf);
      }
      fprintf(out, "\n");
    }
  }
}
