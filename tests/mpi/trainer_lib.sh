# trainer_lib.sh — what the example trainers' shell tests share (sourced by gpt_lib.sh and
# fmnist_lib.sh, not run): one mpirun per run, the parameter comparisons and refused flags.
# The sourcing file sets $b (the build), $sh, $exe and $prog (the trainer, as a path and as a
# spec's prog), $tmp; the test sets $common (every run's flags) and exits with $fail.
# shellcheck shell=sh disable=SC2154,SC2034 # set by the sourcing files; fail read by the test
fail=0

spec() { # name np env args...: run it as $tmp/name.mpi (the trainer with $common and args), the
  # output in $tmp/name.log; rc is its exit status
  name=$1 np=$2 env=$3
  shift 3
  cat >"$tmp/$name.mpi" <<SPEC
np=$np
prog=$prog
env='$env'
args='$common $*'
SPEC
  "$sh" "$b/tests/mpirun.sh" "$tmp/$name.mpi" >"$tmp/$name.log" 2>&1
  rc=$?
}
run_env() { # name np env args...: as spec; a failed run ends the test
  spec "$@"
  name=$1
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
refused() { # what expected-text args...: one rank with $common and args exits 2 naming text
  what=$1 text=$2
  shift 2
  spec refused 1 "" "$@"
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: $what was accepted"
    fail=1
  elif [ "$rc" -ne 2 ]; then
    cat "$tmp/refused.log"
    echo "FAIL: $what: exit $rc, want 2 (a bad flag)"
    fail=1
  elif grep -q -- "$text" "$tmp/refused.log"; then
    echo "ok: $what refused"
  else
    cat "$tmp/refused.log"
    echo "FAIL: $what: no '$text' in the error"
    fail=1
  fi
}
