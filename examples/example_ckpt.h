/* example_ckpt.h — the example trainers' checkpoint directory: DIR/step-NNNNNNNN/rank-RRRRR.ckpt
 * per rank (loom_checkpoint files) and DIR/latest naming the last complete one. */
#ifndef LOOM_EXAMPLES_CKPT_H
#define LOOM_EXAMPLES_CKPT_H

#include <stddef.h>

#include "loom.h"

// The trainers' checkpoint flags and their --help text.
typedef struct ex_ckpt_opts {
  const char *dir; // --ckpt DIR
  long save_every; // --save-every N (0: no checkpoints)
  int resume;      // --resume (a switch: list "--resume" among the flags without a value)
  long die_at;     // --die-at S (testing): SIGKILL every rank in the middle of step S; -1 off
} ex_ckpt_opts_t;
#define EX_CKPT_OPTS_DEFAULT                                                                       \
  { .die_at = -1 }
#define EX_CKPT_HELP                                                                               \
  "checkpoints\n"                                                                                  \
  "  --ckpt DIR          checkpoint directory: DIR/step-NNNNNNNN/rank-RRRRR.ckpt, DIR/latest\n"    \
  "  --save-every N      a checkpoint after every N steps, 0 = none (default 0): parameters,\n"    \
  "                      optimizer state, error-feedback residuals and the --compress auto\n"      \
  "                      plan, CRC-checked and written atomically; the two newest are kept\n"      \
  "  --resume            continue from DIR/latest (a fresh start when there is none): the same\n"  \
  "                      flags and world size give bit for bit the uninterrupted run\n"            \
  "  --die-at S          testing: SIGKILL every rank in the middle of step S (0-based)\n"
// 1 when flag is a checkpoint flag (parsed into o), 0 when it is not, -1 on a bad value (err).
int ex_parse_ckpt(const char *flag, const char *v, ex_ckpt_opts_t *o, char *err, size_t errlen);
// After parsing: -1 with err when --save-every or --resume lack --ckpt, else 0.
int ex_check_ckpt(const ex_ckpt_opts_t *o, char *err, size_t errlen);

// Collective over g. Every rank writes its tensors for step (atomically), then, once every rank
// has, rank 0 points DIR/latest at it (also atomically): a crash at any moment leaves latest at
// a complete checkpoint. Then the checkpoint of step drop (-1: none) is removed. Returns 0 on
// every rank, or -1 on every rank after the failing rank printed why.
int ex_ckpt_save(const char *dir, const loom_group_t *g, long step, long drop,
                 const loom_tensor_t *const *t, int n);
// The step DIR/latest names (rank 0 reads it, every rank gets the answer): -1 when there is no
// checkpoint yet (a fresh start), -2 when latest is unreadable (printed).
long ex_ckpt_latest(const char *dir, const loom_group_t *g);
// DIR/step-NNNNNNNN/rank-RRRRR.ckpt into out. Returns 0, or -1 when it does not fit.
int ex_ckpt_path(char *out, size_t cap, const char *dir, long step, int rank);
// 1 on every rank when any rank passes bad != 0 (a collective OR over g).
int ex_any(const loom_group_t *g, int bad);

// The tensors of a trainer's checkpoint, as views under checkpoint names.
typedef struct ex_ckpt_set {
  loom_tensor_t *t;        // (cap) the views
  const loom_tensor_t **p; // (cap) pointers to them, for loom_checkpoint_save / _load
  int n, cap;
  int32_t *plan; // codec indices, then schemes, then lanes, of a --compress auto plan
} ex_ckpt_set_t;

// Room for cap tensors (plus the error-feedback residuals and a plan added later).
void ex_ckpt_set_init(ex_ckpt_set_t *cs, int cap, const loom_ef_t *ef, int nplan);
// Add a view of src called name (copied).
void ex_ckpt_set_add(ex_ckpt_set_t *cs, const loom_tensor_t *src, const char *name);
// Add every error-feedback residual as "ef:NAME", and a --compress auto plan of n parts (codec
// index into the candidates, -1 none; scheme; lane, loom_plan_choice_t.lane, when lane is not
// NULL: a device plan) as "auto.codec", "auto.scheme" and "auto.lane".
void ex_ckpt_set_add_ef(ex_ckpt_set_t *cs, const loom_ef_t *ef);
void ex_ckpt_set_add_plan(ex_ckpt_set_t *cs, const int *codec, const loom_scheme_t *scheme,
                          const int *lane, int n);
void ex_ckpt_set_free(ex_ckpt_set_t *cs);

// A flag the model depends on beyond its tensors' shapes (train_gpt's --heads: the same
// parameters split into other heads): saved as "flag:NAME" (i64), compared at a resume.
typedef struct ex_ckpt_flag {
  const char *name; // "--heads"
  int64_t value;
} ex_ckpt_flag_t;
// Add every flag as "flag:NAME" (views of flags[i].value: keep flags until the save).
void ex_ckpt_set_add_flags(ex_ckpt_set_t *cs, const ex_ckpt_flag_t *flags, int n);

// Load this rank's checkpoint of step: the tensors of fixed (every one must be in the file with
// its dtype and shape), then every "ef:NAME" residual into ef and a plan into codec/scheme/lane
// (n parts, codec indices below ncand; *planned = 1 when the file holds one; lane may be NULL,
// and a plan saved without lanes, or with a value that is no lane, leaves lane[k] at 0: the GPU
// lane of a device run); a "flag:NAME" entry of one of flags[0..nflags) must hold its value (a
// file without it, from before flags were saved, is not checked). Collective over g: 0 on every
// rank, or -1 on every rank after the failing ones printed why (prog: the trainer).
int ex_ckpt_load(const char *prog, const char *dir, const loom_group_t *g, long step,
                 const ex_ckpt_set_t *fixed, loom_ef_t *ef, int *codec, loom_scheme_t *scheme,
                 int *lane, int n, int ncand, int *planned, const ex_ckpt_flag_t *flags,
                 int nflags);

#endif
