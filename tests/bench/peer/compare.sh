#!/usr/bin/env bash
# compare.sh — run a loom example and its PyTorch DDP peer one after the other, with the same
# model, batch, data and one thread per rank, and print a table of loom vs torch. Optional
# benchmark; not part of CI. Exits non-zero only when a run fails (never on the numbers).
#
#   tests/bench/peer/compare.sh fmnist [--np N] [--epochs E]
#   tests/bench/peer/compare.sh gpt    [--np N] [--steps S]
#
# Environment: BUILD_DIR (loom build folder, default _build, relative to the repository root),
# OUT_DIR (where the logs and JSON files go, default a new /tmp/loom-peer.XXXXXX),
# PYTHON (default /usr/bin/python3, the interpreter Debian's python3-torch is built for).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
BUILD_DIR=${BUILD_DIR:-_build}
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac

usage() {
  cat <<EOF
usage: $0 fmnist [--np N] [--epochs E]
       $0 gpt    [--np N] [--steps S]
Runs loom's example under mpirun and the PyTorch DDP peer (tests/bench/peer/*_ddp.py) with the
same model, per-rank batch, data and one thread per rank, then prints metric, loom, torch and
loom/torch. Defaults: --np 2, --epochs 3 (fmnist), --steps 300 (gpt).
Environment: BUILD_DIR (default _build), OUT_DIR (default a new /tmp/loom-peer.XXXXXX), PYTHON.
EOF
}

die() {
  echo "compare.sh: $*" >&2
  exit 1
}

# ---- arguments

[ $# -ge 1 ] || { usage >&2; exit 2; }
WHAT=$1
shift
case "$WHAT" in
  fmnist | gpt) ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac
NP=2
EPOCHS=3
STEPS=300
while [ $# -gt 0 ]; do
  flag=$1 val=
  case "$flag" in
    --*=*) val=${flag#*=}; flag=${flag%%=*} ;;
    -h | --help) usage; exit 0 ;;
    --*) [ $# -ge 2 ] || { echo "compare.sh: $flag wants a value" >&2; exit 2; }; val=$2; shift ;;
    *) echo "compare.sh: unexpected argument '$flag'" >&2; usage >&2; exit 2 ;;
  esac
  shift
  case "$val" in
    '' | *[!0-9]* | 0) echo "compare.sh: $flag wants a positive integer, got '$val'" >&2; exit 2 ;;
  esac
  case "$WHAT:$flag" in
    *:--np) NP=$val ;;
    fmnist:--epochs) EPOCHS=$val ;;
    gpt:--steps) STEPS=$val ;;
    *) echo "compare.sh: $WHAT does not take $flag" >&2; usage >&2; exit 2 ;;
  esac
done

# ---- what must be there before anything runs

if ! "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
  die "PyTorch is not importable by $PYTHON; on Debian 12 install it with" \
    "\`apt-get install python3-torch\` (it loads in /usr/bin/python3, the Debian interpreter)"
fi
command -v mpirun >/dev/null 2>&1 || die "mpirun not found; \`apt-get install openmpi-bin\`"
LOOM_BIN="$BUILD_DIR/examples/train_$WHAT"
[ -x "$LOOM_BIN" ] || die "$LOOM_BIN is missing: build loom first (./build.sh, or configure and" \
  "make in BUILD_DIR=${BUILD_DIR#"$ROOT"/})"

OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/loom-peer.XXXXXX)}
mkdir -p "$OUT_DIR" || die "cannot create $OUT_DIR"

# One thread per rank on both sides; mpirun as root needs the two ALLOW variables.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OPENBLAS_NUM_THREADS=1 LOOM_BLAS_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

if [ "$WHAT" = fmnist ]; then
  LOOM_CMD=(mpirun -np "$NP" --oversubscribe "$LOOM_BIN" --epochs "$EPOCHS"
            --json "$OUT_DIR/loom.json")
  TORCH_CMD=("$PYTHON" "$HERE/fmnist_ddp.py" --np "$NP" --epochs "$EPOCHS"
             --json "$OUT_DIR/torch.json")
else
  # The same model and train_gpt's default optimizer schedule on both sides: AdamW, lr 1e-3
  # after 30 warmup steps, cosine decay to 1e-4, the global gradient norm clipped to 1.
  MODEL=(--layers 4 --width 256 --heads 4 --ctx 256 --batch 8 --steps "$STEPS" --lr 1e-3
         --warmup 30 --min-lr-frac 0.1 --clip 1)
  LOOM_CMD=(mpirun -np "$NP" --oversubscribe "$LOOM_BIN" "${MODEL[@]}" --sample 0
            --json "$OUT_DIR/loom.json")
  TORCH_CMD=("$PYTHON" "$HERE/gpt_ddp.py" --np "$NP" "${MODEL[@]}" --json "$OUT_DIR/torch.json")
fi

# ---- the two runs, one after the other (never at the same time: they would share the cores)

FAILED=0
run_side() { # name, then the command
  local name=$1
  shift
  echo "== $name: $*"
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  t1=$(date +%s.%N)
  echo "$t0 $t1" | awk '{printf "%.3f\n", $2 - $1}' >"$OUT_DIR/$name.wall"
  if [ "$rc" -ne 0 ]; then
    echo "compare.sh: $name exited with status $rc (log: $OUT_DIR/$name.log)" >&2
    FAILED=1
  elif [ ! -s "$OUT_DIR/$name.json" ]; then
    echo "compare.sh: $name wrote no $OUT_DIR/$name.json" >&2
    FAILED=1
  fi
}
echo "compare.sh: $WHAT, $NP rank(s), one thread per rank; logs and JSON in $OUT_DIR"
echo "compare.sh: timings on a shared machine are noisy: rerun before trusting a ratio"
run_side loom "${LOOM_CMD[@]}"
run_side torch "${TORCH_CMD[@]}"

# ---- the table

"$PYTHON" - "$WHAT" "$OUT_DIR" <<'EOF' || FAILED=1
import json
import os
import sys

what, out = sys.argv[1], sys.argv[2]


def load(name):
    d = {}
    try:
        with open(os.path.join(out, name + ".json")) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        print("compare.sh: %s.json: %s" % (name, e), file=sys.stderr)
    try:
        with open(os.path.join(out, name + ".wall")) as f:
            d["_run_wall_s"] = float(f.read())
    except (OSError, ValueError):
        pass
    return d


loom, torch = load("loom"), load("torch")
if what == "fmnist":
    rows = [("samples/s", "samples_per_s", "%.0f"), ("test accuracy", "test_acc", "%.4f"),
            ("train loss (last epoch)", "train_loss", "%.4f"), ("test loss", "test_loss", "%.4f"),
            ("training time (s)", "train_time_s", "%.1f"), ("run wall (s)", "_run_wall_s", "%.1f")]
else:
    rows = [("tokens/s", "tokens_per_s", "%.0f"), ("MFU", "mfu", "%.3f"),
            ("sgemm GFLOP/s (1 thread)", "sgemm_gflops", "%.1f"),
            ("train loss", "train_loss", "%.4f"), ("val loss", "val_loss", "%.4f"),
            ("wall (s, program)", "wall_s", "%.1f"), ("run wall (s)", "_run_wall_s", "%.1f")]


def cell(d, key, fmt):
    v = d.get(key)
    return fmt % v if isinstance(v, (int, float)) else "-"


ranks = loom.get("np", torch.get("np", "?"))
print()
print("%s, %s rank(s): loom vs PyTorch %s DDP (gloo)" % (what, ranks, torch.get("torch", "")))
print("%-26s %12s %12s %8s" % ("metric", "loom", "torch", "ratio"))
for label, key, fmt in rows:
    a, b = loom.get(key), torch.get(key)
    ratio = "%.2f" % (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
        and b != 0 else "-"
    print("%-26s %12s %12s %8s" % (label, cell(loom, key, fmt), cell(torch, key, fmt), ratio))
print("ratio = loom / torch; throughput excludes evaluation on both sides")
EOF

if [ "$FAILED" -ne 0 ]; then
  echo "compare.sh: a run failed (see above); logs in $OUT_DIR" >&2
  exit 1
fi
exit 0
