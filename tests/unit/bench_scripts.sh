#!/bin/sh
# bench_scripts.sh — the scripts under tests/bench name what is wrong and exit 2: soak.sh given
# too few steps to compare anything, or no number; slownet (as root) with unshare missing from
# PATH (it once died with the shell's "not found") and with a rate tc refuses (tc's bare usage).
set -u
src=${LOOM_SRCDIR:-.}
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fail=0
# expect NAME TEXT CMD...: exit 2 with TEXT on stderr
expect() {
  name=$1 text=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "$text" "$tmp/err"; then
    echo "FAIL: $name: exit $rc (want 2), stderr: $(tail -2 "$tmp/err")"
    fail=1
  else
    echo "ok: $name"
  fi
}
soak=$src/tests/bench/soak.sh
if command -v bash >/dev/null 2>&1; then # (soak.sh is a bash script; no train_gpt in $tmp)
  expect "soak.sh 100" "soak: usage: .*got '100'" env LOOM_BUILDDIR="$tmp" bash "$soak" 100
  expect "soak.sh 2000 x" "soak: usage: .*got '2000' 'x'" env LOOM_BUILDDIR="$tmp" bash "$soak" 2000 x
fi
s=$src/tests/bench/slownet
[ "$(id -u)" -eq 0 ] || { echo "(slownet: not root, not checked)"; exit $fail; }
mkdir "$tmp/bin"
for t in id tc ip; do # everything slownet needs but unshare
  p=$(command -v "$t") || { echo "(slownet: no $t here, not checked)"; exit $fail; }
  ln -s "$p" "$tmp/bin/$t"
done
expect "slownet without unshare" "unshare not found" env PATH="$tmp/bin" /bin/sh "$s" 1gbit -- true
if unshare -n true 2>/dev/null; then # (a container may refuse new namespaces)
  expect "slownet 1xbit" "tc could not limit lo to 1xbit" /bin/sh "$s" 1xbit -- true
fi
exit $fail
