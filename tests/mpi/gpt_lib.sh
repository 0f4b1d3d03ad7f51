# gpt_lib.sh — what the train_gpt shell tests share (sourced, not run): the build and source
# paths, a fixed corpus (tests/mpi/gpt_corpus.txt), one mpirun per run, and the comparisons.
# The sourcing test sets $common (the flags of every run) after sourcing, and exits with $fail.
# shellcheck disable=SC2154,SC2034 # common is set, and fail read, by the sourcing test
b=${LOOM_BUILDDIR:-.}
src=${srcdir:-.}
sh=${SHELL:-/bin/sh}
exe=$b/examples/train_gpt
[ -x "$exe" ] || { echo "FAIL: $exe is not built"; exit 99; }
corpus=$src/tests/mpi/gpt_corpus.txt
[ -r "$corpus" ] || { echo "FAIL: $corpus (the test corpus) is missing"; exit 99; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A fixed corpus (paragraphs of an early README, separated by % lines): the equivalence bounds
# were set on it, and it must not change when the README does.
cp "$corpus" "$tmp/corpus"

run_env() { # name np env args...: train_gpt with $common and args, env in the spec
  name=$1 np=$2 env=$3
  shift 3
  cat >"$tmp/$name.mpi" <<SPEC
np=$np
prog=examples/train_gpt
env='$env'
args='$common $*'
SPEC
  "$sh" "$b/tests/mpirun.sh" "$tmp/$name.mpi" >"$tmp/$name.log" 2>&1
  rc=$?
  if [ "$rc" -ne 0 ]; then
    cat "$tmp/$name.log"
    echo "FAIL: the $name run exited with $rc"
    exit 1
  fi
}
run() { # name np args...
  name=$1 np=$2
  shift 2
  run_env "$name" "$np" "" "$@"
}

fail=0
same() { # what file-a file-b: bitwise
  if cmp -s "$2" "$3"; then
    echo "ok: $1"
  else
    echo "FAIL: $1: $2 and $3 differ"
    fail=1
  fi
}
same_ranks() { # what prefix np: every rank's PREFIX_R.bin equals rank 0's, bitwise
  sr_r=1
  while [ "$sr_r" -lt "$3" ]; do
    same "$1: rank $sr_r equals rank 0" "$2_0.bin" "$2_$sr_r.bin"
    sr_r=$((sr_r + 1))
  done
}
close() { # what file-a file-b [rtol]: parameters within a relative tolerance (default 1e-5)
  if "$exe" --compare "$2" "$3" --rtol "${4:-1e-5}"; then
    echo "ok: $1 within rtol ${4:-1e-5}"
  else
    echo "FAIL: $1"
    fail=1
  fi
}
