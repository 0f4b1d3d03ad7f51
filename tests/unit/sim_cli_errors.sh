#!/bin/sh
# sim_cli_errors.sh — loom_sim says a file it cannot load once, as "loom_sim: MESSAGE" on stderr
# with exit 1, not as the library's prefixed WARN line; LOOM_DEBUG set keeps the log line too.
set -u
b=${LOOM_BUILDDIR:-.}
s=${srcdir:-.}
exe=$b/loom_sim
[ -x "$exe" ] || { echo "FAIL: $exe is not built"; exit 99; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cluster=$s/tests/scaling/clusters/example-64x8.cluster
fail=0
printf '{"not": "a profile"}\n' >"$tmp/bad.prof"

check() { # what expected-text args...: exit 1, one stderr line "loom_sim: ...text..."
  what=$1 text=$2
  shift 2
  env -u LOOM_DEBUG "$exe" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "^loom_sim: .*$text" "$tmp/err" &&
    ! grep -q "LOOM WARN" "$tmp/err" && [ ! -s "$tmp/out" ]; then
    echo "ok: $what: $(cat "$tmp/err")"
  else
    echo "FAIL: $what: exit $rc, stderr:"
    cat "$tmp/err"
    fail=1
  fi
}
check "a missing profile" "cannot read the profile $tmp/none: No such file" \
  --profile "$tmp/none" --cluster "$cluster"
check "a file that is not a profile" "is not a loom profile of version 1" \
  --profile "$tmp/bad.prof" --cluster "$cluster"
# Asked for log lines, the library's WARN line stays (and the tool's line follows it).
LOOM_DEBUG=WARN "$exe" --profile "$tmp/bad.prof" --cluster "$cluster" >/dev/null 2>"$tmp/err"
if grep -q "LOOM WARN" "$tmp/err" && grep -q "^loom_sim: " "$tmp/err"; then
  echo "ok: LOOM_DEBUG=WARN keeps the log line"
else
  echo "FAIL: LOOM_DEBUG=WARN: stderr:"
  cat "$tmp/err"
  fail=1
fi
exit $fail
