#!/bin/sh
# timeshare_median.sh — timeshare_perf's per-size value is the median of its rounds minus 1; with
# an even --rounds, the mean of the two middle rounds (it took the upper one). Tiny products.
# More rounds than it holds (64) is refused naming the limit (it ran and printed 64 instead).
set -u
b=${LOOM_BUILDDIR:-.}
p=$b/tests/bench/timeshare_perf
[ -x "$p" ] || { echo "FAIL: $p is not built"; exit 99; }
out=$(mktemp) || exit 99
trap 'rm -f "$out"' EXIT
timeout 60 "$p" --rounds 65 --n 16 --iters 1 >"$out" 2>&1
rc=$?
if [ $rc -ne 2 ] || ! grep -q -- '--rounds 65: at most 64 rounds' "$out"; then
  head -3 "$out"
  echo "FAIL: --rounds 65: exit $rc (want 2, and the limit named)"
  exit 1
fi
echo "ok: --rounds 65 is refused"
if ! timeout 60 "$p" --rounds 4 --n 16 --iters 1 >"$out" 2>&1; then
  cat "$out"
  grep -q 'cannot pin to core' "$out" && { echo "SKIP: core 0 is not ours to pin to"; exit 77; }
  echo "FAIL: timeshare_perf exited non-zero"
  exit 1
fi
# the rounds' T_K / (K T_1), sorted; the printed "# n 16: F"; F must be their median - 1
if awk '$1 == 16 && NF == 6 { f[n++] = $6 }
        /^# n 16:/ { got = $4 }
        END {
          if (n != 4 || got == "") exit 1
          for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (f[j] < f[i]) { t = f[i]; f[i] = f[j]; f[j] = t }
          want = (f[1] + f[2]) / 2 - 1
          d = got - want
          exit !(d <= 0.0011 && d >= -0.0011)
        }' "$out"; then
  echo "ok: the median of an even number of rounds is the mean of the middle two"
else
  cat "$out"
  echo "FAIL: the printed value is not the median of the rounds minus 1"
  exit 1
fi
