#!/bin/sh
# readme_tunables.sh — README.md's tunables table and group-layout tables must be exactly what
# loom_info prints, so the docs cannot drift from the code. Regenerate with the commands shown.
set -u
b=${LOOM_BUILDDIR:-.}; s=${LOOM_SRCDIR:-.}
readme=$s/README.md
fail=0
# section NAME COMMAND...: compare the README block between <!-- NAME:begin --> and :end.
section() {
  name=$1; shift
  want=$(env -u LOOM_NODE_SIZE -u LOOM_EP_SIZE -u LOOM_ATTN_SERVERS "$@") || {
    echo "FAIL: '$*' failed"; fail=1; return; }
  have=$(sed -n "/<!-- $name:begin -->/,/<!-- $name:end -->/p" "$readme" | sed '1d;$d')
  # Both empty would compare equal: a silent loom_info against a README without the block.
  if [ -z "$want" ] || [ -z "$have" ]; then
    echo "FAIL: block '$name': $([ -z "$want" ] && echo "'$*' printed nothing" ||
      echo "README.md has no <!-- $name:begin --> ... <!-- $name:end --> block, or it is empty")"
    fail=1
  elif [ "$want" != "$have" ]; then
    echo "FAIL: README.md block '$name' differs from: $*"
    printf '%s\n' "$want" > readme_want.$$; printf '%s\n' "$have" > readme_have.$$
    diff readme_have.$$ readme_want.$$; rm -f readme_want.$$ readme_have.$$
    fail=1
  else
    echo "ok: README block '$name'"
  fi
}
section tunables "$b/loom_info" --tunables-markdown
section layout-default "$b/loom_info" --layout 8
section layout-node2-ep2 env LOOM_NODE_SIZE=2 LOOM_EP_SIZE=2 "$b/loom_info" --layout 8
section layout-attn1 env LOOM_ATTN_SERVERS=1 "$b/loom_info" --layout 8
exit $fail
