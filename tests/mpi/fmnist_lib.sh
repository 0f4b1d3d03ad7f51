# fmnist_lib.sh — what the train_fmnist shell tests share (sourced, not run): the build path, the
# Fashion-MNIST files (a SKIP when they are missing), a temporary folder, and trainer_lib.sh's
# runs and comparisons. The sourcing test sets $common after sourcing, and exits with $fail.
# shellcheck shell=sh disable=SC2034 # read by trainer_lib.sh and the sourcing test
b=${LOOM_BUILDDIR:-.}
sh=${SHELL:-/bin/sh}
data=${LOOM_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do
  if [ ! -r "$data/$f" ]; then
    echo "SKIP: $data/$f is missing: apt-get install dataset-fashion-mnist (or set LOOM_FMNIST_DIR)"
    exit 77
  fi
done
prog=examples/train_fmnist
exe=$b/$prog
[ -x "$exe" ] || { echo "FAIL: $exe is not built"; exit 99; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "${srcdir:-.}/tests/mpi/trainer_lib.sh"
