#!/usr/bin/env bash
# plot.sh — draws OUT/scaling.csv (from collect.py) with gnuplot: OUT/throughput.png and
# OUT/efficiency.png (one line per train_gpt series against ranks), OUT/coll_busbw.png.
set -euo pipefail

usage="usage: tests/scaling/plot.sh OUT   (reads OUT/scaling.csv, writes OUT/*.png)"
[ $# -eq 1 ] || {
  echo "$usage" >&2
  exit 2
}
case $1 in -h | --help)
  echo "$usage"
  exit 0
  ;;
esac
out=$1
csv=$out/scaling.csv
command -v gnuplot >/dev/null 2>&1 || {
  echo "plot.sh: gnuplot not found: apt-get install gnuplot-nox" >&2
  exit 1
}
[ -r "$csv" ] || {
  echo "plot.sh: $csv not found: run tests/scaling/collect.py $out first" >&2
  exit 1
}
term=png
gnuplot -e 'set terminal' 2>/dev/null | grep -q pngcairo && term=pngcairo

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One data file per series, "np value" lines sorted by np; the series list as "file<TAB>title".
# Columns of scaling.csv (by name, so that new columns do not break this).
awk -F, -v dir="$tmp" '
  NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
  { print $c["np"] > (dir "/nps") }
  $c["kind"] == "train" {
    s = $c["config"] " " $c["compress"] " " $c["mode"]
    if ($c["net"] != "unlimited") s = s " " $c["net"]
    if (!(s SUBSEP $c["model"] in seen)) { seen[s SUBSEP $c["model"]] = 1; models[$c["model"]]++ }
    key = s "|" $c["model"]
    if (!(key in id)) { id[key] = ++n; title[n] = s; model[n] = $c["model"] }
    f = id[key]
    print $c["np"], $c["tokens_per_s"], $c["efficiency"] > (dir "/t" f ".raw")
  }
  $c["kind"] == "coll" && $c["np"] > 1 { # busbw of one rank is no bandwidth
    k = $c["op"] " " $c["compress"] ($c["net"] != "unlimited" ? " " $c["net"] : "")
    m = k SUBSEP $c["np"]
    if (!(m in big) || $c["bytes"] + 0 > big[m] + 0) { big[m] = $c["bytes"]; bw[m] = $c["busbw"] }
    if (!(k in cid)) { cid[k] = ++nc; ctitle[nc] = k }
    if ($c["bytes"] + 0 > cmax[cid[k]] + 0) cmax[cid[k]] = $c["bytes"]
    nps[m] = $c["np"]
  }
  END {
    nm = 0; for (x in models) nm++
    for (i = 1; i <= n; i++)
      print "t" i "\t" title[i] (nm > 1 ? " " model[i] : "") > (dir "/train.list")
    for (m in big) {
      split(m, p, SUBSEP)
      print nps[m], bw[m], big[m] > (dir "/c" cid[p[1]] ".raw")
    }
    for (i = 1; i <= nc; i++) {
      b = cmax[i]; u = "B"
      if (b >= 1048576 && b % 1048576 == 0) { b /= 1048576; u = "MiB" }
      else if (b >= 1024 && b % 1024 == 0) { b /= 1024; u = "KiB" }
      print "c" i "\t" ctitle[i] " (" b " " u ")" > (dir "/coll.list")
    }
  }' "$csv"
for f in "$tmp"/*.raw; do
  [ -e "$f" ] || continue
  sort -n "$f" >"${f%.raw}.dat"
done

plot_lines() { # list column -> a gnuplot plot clause over every series in the list
  local list=$1 col=$2 sep="" f t
  while IFS=$'\t' read -r f t; do
    printf '%s"%s" using 1:%d with linespoints title "%s"' "$sep" "$tmp/$f.dat" "$col" "$t"
    sep=", "
  done <"$list"
}

xtics=$(sort -n -u "$tmp/nps" | paste -s -d, -)
common="set terminal $term size 900,600; set termoption noenhanced; set grid;
set logscale x 2; set xtics ($xtics); set xlabel 'ranks (np)'; set key outside right top;
set offsets graph 0.05, graph 0.05, 0, 0"
made=()
if [ -s "$tmp/train.list" ]; then
  gnuplot -e "$common; set output '$out/throughput.png';
    set title 'train_gpt throughput'; set ylabel 'tokens/s (all ranks)'; set yrange [0:*];
    plot $(plot_lines "$tmp/train.list" 2)"
  gnuplot -e "$common; set output '$out/efficiency.png';
    set title 'train_gpt scaling efficiency: tokens/s / (np/np0 x tokens/s at np0)';
    set ylabel 'efficiency'; set yrange [0:1.1<*];
    plot 1 with lines dashtype 2 lc rgb 'gray' title 'ideal', $(plot_lines "$tmp/train.list" 3)"
  made+=("$out/throughput.png" "$out/efficiency.png")
else
  echo "plot.sh: no train_gpt rows in $csv: throughput.png and efficiency.png not drawn" >&2
fi
if [ -s "$tmp/coll.list" ]; then
  gnuplot -e "$common; set output '$out/coll_busbw.png';
    set title 'coll_perf bus bandwidth at the largest message size (np >= 2)'; set ylabel 'busbw (GB/s)';
    set xrange [1:*]; set yrange [0:*]; plot $(plot_lines "$tmp/coll.list" 2)"
  made+=("$out/coll_busbw.png")
else
  echo "plot.sh: no coll_perf rows in $csv: coll_busbw.png not drawn" >&2
fi
[ ${#made[@]} -gt 0 ] || {
  echo "plot.sh: nothing to plot in $csv" >&2
  exit 1
}
echo "plot.sh: wrote ${made[*]}"
