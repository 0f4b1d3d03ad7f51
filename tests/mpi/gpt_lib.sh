# gpt_lib.sh — what the train_gpt shell tests share (sourced, not run): the build and source
# paths, a fixed corpus (tests/mpi/gpt_corpus.txt), and trainer_lib.sh's runs and comparisons.
# The sourcing test sets $common (the flags of every run) after sourcing, and exits with $fail.
# shellcheck shell=sh disable=SC2154,SC2034 # common is set, and fail read, by the sourcing test
b=${LOOM_BUILDDIR:-.}
src=${srcdir:-.}
sh=${SHELL:-/bin/sh}
prog=examples/train_gpt
exe=$b/$prog
[ -x "$exe" ] || { echo "FAIL: $exe is not built"; exit 99; }
corpus=$src/tests/mpi/gpt_corpus.txt
[ -r "$corpus" ] || { echo "FAIL: $corpus (the test corpus) is missing"; exit 99; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A fixed corpus (paragraphs of an early README, separated by % lines): the equivalence bounds
# were set on it, and it must not change when the README does.
cp "$corpus" "$tmp/corpus"

. "$src/tests/mpi/trainer_lib.sh" # run_env, run, same, same_ranks, close, refused
