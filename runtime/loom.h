/* loom.h — the one header a training program includes to embed loom.
 * It pulls in the runtime (init, groups, errors, tunables) and tensors. */
#ifndef LOOM_H
#define LOOM_H

#include "loom_version.h"
#include "loom_core.h"
#include "loom_tensor.h"
#include "loom_checkpoint.h"
#include "loom_compute.h"
#include "loom_comm.h"
#include "loom_compress.h"
#include "loom_moe.h"
#include "loom_attn.h"
#include "loom_sched.h"
#include "loom_plan.h"
#include "loom_attn_plan.h"

#endif
