#!/bin/sh
# exports.sh — the shared libloom exports exactly the loom_ functions of the public headers:
# nothing else (hidden visibility), and every LOOM_API declaration is really exported.
set -u
b=${LOOM_BUILDDIR:-.}; s=${LOOM_SRCDIR:-.}
lib=$(ls "$b"/.libs/libloom.so.* 2>/dev/null | head -1)
[ -n "$lib" ] || { echo "SKIP: no shared libloom built"; exit 77; }
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' | sort)
bad=$(printf '%s\n' "$syms" | grep -v '^loom_' | grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$')
fail=0
if [ -n "$bad" ]; then
  echo "FAIL: libloom exports symbols without the loom_ prefix:"; printf '%s\n' "$bad"; fail=1
fi
declared=$(grep -h -o -E 'LOOM_API [^(]*[ *]loom_[a-z0-9_]+\(' "$s"/runtime/loom_*.h "$s"/compute/loom_*.h "$s"/comm/loom_*.h "$s"/sched/loom_*.h |
           sed -E 's/.*(loom_[a-z0-9_]+)\(/\1/' | sort -u)
for f in $declared; do
  printf '%s\n' "$syms" | grep -qx "$f" || { echo "FAIL: $f is declared LOOM_API but not exported"; fail=1; }
done
extra=$(printf '%s\n' "$syms" | grep '^loom_' | while read -r f; do
  printf '%s\n' "$declared" | grep -qx "$f" || echo "$f"; done)
if [ -n "$extra" ]; then
  echo "FAIL: exported but not declared in a public header:"; printf '%s\n' "$extra"; fail=1
fi
[ $fail -eq 0 ] && echo "ok: $(printf '%s\n' "$syms" | grep -c '^loom_') loom_ symbols, nothing else"
exit $fail
