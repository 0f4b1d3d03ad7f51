#!/bin/sh
# trainers_device.sh — the device paths of the example trainers against their host runs: train_gpt
# and train_fmnist --device cuda with --compress int8 (the CUDA codecs over NCCL, device error
# feedback; train_gpt also with the hierarchical scheme), train_gpt --device cuda --moe-experts 4
# (MoE over NCCL), --compress auto on the device (the GPU lane), and a checkpoint resume keeping
# the device residuals. SKIP (77) without a GPU. np 1, and np 2 where two GPUs are visible (NCCL
# wants one GPU per rank).
#
# Tolerances: the GPU kernels round differently from the CPU ones (fp32 either way), so a device
# run's final training loss must be within 2% (relative) of the host run's; a resumed device run
# must equal the straight one within rtol 1e-5 (--compare).
set -u
export LOOM_COMPRESS=none
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${ngpu:-0}" -lt 1 ]; then
  echo "SKIP: no GPU visible (nvidia-smi -L lists none): the device paths need one"
  exit 77
fi
. "${srcdir:-${LOOM_SRCDIR:-.}}/tests/mpi/gpt_lib.sh" # $b, $exe, $tmp/corpus, run, same, close
common="--layers 2 --width 64 --heads 2 --ctx 64 --batch 4 --steps 20 --seed 3 --lr 0.003"
common="$common --warmup 0 --min-lr-frac 1 --sample 0 --val-every 0 --val-rows 4"
common="$common --log-every 20 --data $tmp/corpus"

# loss NAME: the mean training loss of the last progress line of run NAME.
loss() {
  sed -n 's/^step *[0-9]*\/[0-9]*  loss \([0-9.]*\) .*/\1/p' "$tmp/$1.log" | tail -1
}
# near WHAT A B: the losses of runs A and B within 2% of A's.
near() {
  la=$(loss "$2") lb=$(loss "$3")
  if [ -n "$la" ] && [ -n "$lb" ] &&
    awk -v a="$la" -v b="$lb" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * a) }'; then
    echo "ok: $1: loss $lb on the device, $la on the host (within 2%)"
  else
    echo "FAIL: $1: loss '$lb' on the device, '$la' on the host (want within 2%)"
    fail=1
  fi
}

nps=1
[ "$ngpu" -ge 2 ] && nps="1 2"
for np in $nps; do
  run "host_int8_np$np" "$np" --compress int8
  run "cuda_int8_np$np" "$np" --compress int8 --device cuda
  near "train_gpt np $np --compress int8" "host_int8_np$np" "cuda_int8_np$np"
  run "host_idv_np$np" "$np" --compress efsign --compress-scheme indivisible
  run "cuda_idv_np$np" "$np" --compress efsign --compress-scheme indivisible --device cuda
  near "train_gpt np $np --compress efsign, indivisible" "host_idv_np$np" "cuda_idv_np$np"
  run "host_hier_np$np" "$np" --compress int8 --compress-scheme hierarchical
  run "cuda_hier_np$np" "$np" --compress int8 --compress-scheme hierarchical --device cuda
  near "train_gpt np $np --compress int8, hierarchical" "host_hier_np$np" "cuda_hier_np$np"
  run "host_moe_np$np" "$np" --moe-experts 4 --moe-every 1
  run "cuda_moe_np$np" "$np" --moe-experts 4 --moe-every 1 --device cuda
  near "train_gpt np $np --moe-experts 4" "host_moe_np$np" "cuda_moe_np$np"
  run "cuda_moe_dump_np$np" "$np" --moe-experts 4 --moe-every 1 --device cuda --steps 2 \
    --dump-params "$tmp/moe_np$np.bin"
  [ -s "$tmp/moe_np$np.bin" ] && echo "ok: np $np: a device MoE model dumps its parameters" ||
    { echo "FAIL: np $np: no dump of the device MoE model"; fail=1; }
done
if [ "$ngpu" -ge 2 ]; then
  run_env cuda_moe_ep2 2 "LOOM_EP_SIZE=2" --moe-experts 4 --moe-every 1 --device cuda
  near "train_gpt np 2 --moe-experts 4, LOOM_EP_SIZE 2" host_moe_np2 cuda_moe_ep2
  run cuda_auto 2 --compress auto --device cuda
  grep -q "compression plan (auto)" "$tmp/cuda_auto.log" &&
    echo "ok: --compress auto on the device printed a plan" ||
    { cat "$tmp/cuda_auto.log"; echo "FAIL: --compress auto on the device made no plan"; fail=1; }
  if grep -Eq ' (compute|worker|cpu) +[0-9.]+$' "$tmp/cuda_auto.log"; then
    echo "FAIL: the device plan encodes on a lane the device executor lacks"; fail=1
  fi
fi

# Checkpoint and resume with device error feedback: 20 steps straight equal 10 + resume to 20.
np=1
[ "$ngpu" -ge 2 ] && np=2
run straight "$np" --compress int8 --device cuda --dump-params "$tmp/straight.bin"
run first "$np" --compress int8 --device cuda --steps 10 --ckpt "$tmp/ck" --save-every 10
run resumed "$np" --compress int8 --device cuda --ckpt "$tmp/ck" --resume \
  --dump-params "$tmp/resumed.bin"
grep -q "resume: step 10" "$tmp/resumed.log" && echo "ok: resumed at step 10" ||
  { echo "FAIL: the resumed run did not start at step 10"; fail=1; }
close "np $np, device int8: 20 steps straight equal 10 + resume" "$tmp/straight.bin" \
  "$tmp/resumed.bin"

# train_fmnist on Fashion-MNIST (Debian's dataset-fashion-mnist; skipped, not failed, without it).
fm=$b/examples/train_fmnist
fmdata=/usr/share/datasets/fashion-mnist
fcommon="--steps 40 --batch 32 --seed 3"
fnps=$nps
if [ ! -r "$fmdata/train-images-idx3-ubyte.gz" ]; then
  echo "skip: train_fmnist: no Fashion-MNIST in $fmdata (apt-get install dataset-fashion-mnist)"
  fnps=
fi
for np in $fnps; do
  for dev in host cuda; do
    cat >"$tmp/fm_${dev}_np$np.mpi" <<SPEC
np=$np
prog=examples/train_fmnist
args='$fcommon --compress int8 --device $dev'
SPEC
    "$sh" "$b/tests/mpirun.sh" "$tmp/fm_${dev}_np$np.mpi" >"$tmp/fm_${dev}_np$np.log" 2>&1 ||
      { cat "$tmp/fm_${dev}_np$np.log"; echo "FAIL: train_fmnist --device $dev np $np"; fail=1; }
  done
  la=$(sed -n 's/.*train_loss \([0-9.]*\).*/\1/p' "$tmp/fm_host_np$np.log" | tail -1)
  lb=$(sed -n 's/.*train_loss \([0-9.]*\).*/\1/p' "$tmp/fm_cuda_np$np.log" | tail -1)
  if [ -n "$la" ] && [ -n "$lb" ] &&
    awk -v a="$la" -v b="$lb" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * a) }'; then
    echo "ok: train_fmnist np $np --compress int8: loss $lb on the device, $la on the host"
  else
    echo "FAIL: train_fmnist np $np --compress int8: loss '$lb' on the device, '$la' on the host"
    fail=1
  fi
done
[ -x "$fm" ] || { echo "FAIL: $fm is not built"; fail=1; }
exit "$fail"
