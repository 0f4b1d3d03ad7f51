#!/bin/sh
# slownet_tools.sh — tests/bench/slownet names what it lacks and exits 2: unshare missing from
# PATH (it once died with the shell's "not found"), and a rate tc refuses (a bare tc usage).
set -u
src=${LOOM_SRCDIR:-.}
s=$src/tests/bench/slownet
[ -r "$s" ] || { echo "FAIL: $s is missing"; exit 99; }
[ "$(id -u)" -eq 0 ] || { echo "SKIP: slownet needs root"; exit 77; }
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
mkdir "$tmp/bin"
for t in id tc ip; do # everything slownet needs but unshare
  p=$(command -v "$t") || { echo "SKIP: no $t here"; exit 77; }
  ln -s "$p" "$tmp/bin/$t"
done
expect "no unshare" "unshare not found" env PATH="$tmp/bin" /bin/sh "$s" 1gbit -- true
if unshare -n true 2>/dev/null; then # (a container may refuse new namespaces)
  expect "a rate tc refuses" "tc could not limit lo to 1xbit" /bin/sh "$s" 1xbit -- true
fi
exit $fail
