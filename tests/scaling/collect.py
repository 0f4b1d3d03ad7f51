#!/usr/bin/env python3
# collect.py — merges OUT/runs/*.json (train_gpt and coll_perf runs of run_scaling.sh) into
# OUT/scaling.csv with speedup and scaling efficiency per series; standard library only.
"""usage: tests/scaling/collect.py OUT [--quiet]

Reads every OUT/runs/*.json, skips (with a message) any that is not a valid JSON object of a
train_gpt or coll_perf run, and writes OUT/scaling.csv: one row per train_gpt run (kind train)
and one per coll_perf result (kind coll: op, bytes, algbw, busbw). A series is the runs that
share config, compress, mode, net and model; speedup = tokens_per_s / that of the series'
smallest np (np0), efficiency = tokens_per_s / (np / np0 * tokens_per_s at np0), in weak and
strong mode alike. Prints the table. Exit 0 when at least one row was written, 1 otherwise.
"""
import csv
import glob
import json
import os
import sys

COLUMNS = [
    "kind", "config", "compress", "mode", "net", "model", "np", "nodes", "batch_per_rank",
    "steps", "tokens_per_s", "step_ms", "speedup", "efficiency", "val_loss",
    "bytes_sent_per_step", "op", "bytes", "algbw", "busbw", "time_us", "file",
]


def warn(msg):
    print("collect: " + msg, file=sys.stderr)


def num(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("%s is not a number: %r" % (what, v))
    return v


def infer_config(d):
    """A train_gpt JSON without the harness object (run by hand): its config from its flags."""
    if d.get("moe_experts", 0):
        return "moe"
    if d.get("attn_servers", "off") != "off":
        return "attn"
    return "dense"


def train_row(d, h, name):
    np_ = int(num(h.get("np", d.get("np")), "np"))
    if np_ < 1:
        raise ValueError("np %d < 1" % np_)
    tps = num(d["tokens_per_s"], "tokens_per_s")
    model = "L%d-C%d-H%d-ctx%d" % (num(d["layers"], "layers"), num(d["width"], "width"),
                                   num(d["heads"], "heads"), num(d["ctx"], "ctx"))
    return {
        "kind": "train",
        "config": h.get("config", infer_config(d)),
        "compress": h.get("compress", d.get("compress", "")),
        "mode": h.get("mode", "weak"),
        "net": h.get("net", "unlimited"),
        "model": model,
        "np": np_,
        "nodes": h.get("nodes", ""),
        "batch_per_rank": h.get("batch_per_rank", d.get("batch", "")),
        "steps": d.get("steps", h.get("steps", "")),
        "tokens_per_s": tps,
        "step_ms": num(d["step_ms"], "step_ms"),
        "val_loss": d.get("val_loss", ""),
        "bytes_sent_per_step": d.get("bytes_sent_per_step", ""),
        "file": name,
    }


def coll_rows(d, h, name):
    res = d["results"]
    if not isinstance(res, list):
        raise ValueError("results is not a list")
    np_ = int(num(h.get("np", d.get("ranks")), "np"))
    out = []
    for r in res:
        if not isinstance(r, dict):
            raise ValueError("a result is not an object")
        out.append({
            "kind": "coll",
            "config": "coll_perf",
            "compress": h.get("compress", "none"),
            "mode": h.get("mode", "bench"),
            "net": h.get("net", "unlimited"),
            "model": d.get("backend", "loom"),
            "np": np_,
            "nodes": h.get("nodes", ""),
            "op": r["op"],
            "bytes": int(num(r["size"], "size")),
            "algbw": num(r["algbw"], "algbw"),
            "busbw": num(r["busbw"], "busbw"),
            "time_us": num(r["time_us"], "time_us"),
            "file": name,
        })
    return out


def load(path):
    name = os.path.basename(path)
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        warn("skipping %s: not valid JSON (%s)" % (path, e))
        return []
    if not isinstance(d, dict):
        warn("skipping %s: not a JSON object" % path)
        return []
    h = d.get("harness", {})
    if not isinstance(h, dict):
        h = {}
    try:
        if "results" in d:
            return coll_rows(d, h, name)
        if "tokens_per_s" in d:
            return [train_row(d, h, name)]
        warn("skipping %s: neither a train_gpt JSON (tokens_per_s) nor a coll_perf one (results)"
             % path)
    except (KeyError, ValueError, TypeError) as e:
        warn("skipping %s: missing or bad field (%s: %s)" % (path, type(e).__name__, e))
    return []


def add_scaling(rows):
    series = {}
    for r in rows:
        if r["kind"] == "train":
            key = (r["config"], r["compress"], r["mode"], r["net"], r["model"])
            series.setdefault(key, []).append(r)
    for runs in series.values():
        base = min(runs, key=lambda r: r["np"])
        for r in runs:
            if base["tokens_per_s"] > 0:
                r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
                r["efficiency"] = r["speedup"] / (r["np"] / base["np"])
            else:
                r["speedup"] = r["efficiency"] = ""


def fmt(v):
    if isinstance(v, float):
        return "%.6g" % v
    return str(v)


def table(rows):
    train = [r for r in rows if r["kind"] == "train"]
    if train:
        cols = ["config", "compress", "mode", "net", "np", "nodes", "batch_per_rank",
                "tokens_per_s", "step_ms", "speedup", "efficiency", "val_loss",
                "bytes_sent_per_step"]
        print_table(cols, train, {"tokens_per_s": "%.0f", "step_ms": "%.2f", "speedup": "%.2f",
                                  "efficiency": "%.2f", "val_loss": "%.4f",
                                  "bytes_sent_per_step": "%.0f"})
    coll = [r for r in rows if r["kind"] == "coll"]
    if coll:
        # The largest message of each op: the bandwidth that scales.
        big = {}
        for r in coll:
            k = (r["compress"], r["net"], r["op"], r["np"])
            if k not in big or r["bytes"] > big[k]["bytes"]:
                big[k] = r
        print()
        print_table(["op", "compress", "net", "np", "bytes", "time_us", "algbw", "busbw"],
                    sorted(big.values(), key=lambda r: (r["compress"], r["net"], r["op"],
                                                        r["np"])),
                    {"time_us": "%.1f", "algbw": "%.2f", "busbw": "%.2f"})


def print_table(cols, rows, fmts):
    cells = [[(fmts[c] % r[c]) if c in fmts and isinstance(r.get(c), (int, float))
              else fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for x in cells:
        print("  ".join(v.rjust(w) for v, w in zip(x, widths)))


def main(argv):
    args = [a for a in argv[1:] if a != "--quiet"]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if args and args[0] in ("-h", "--help") else 2
    out = args[0]
    paths = sorted(glob.glob(os.path.join(out, "runs", "*.json")))
    if not paths:
        warn("no %s/runs/*.json: run tests/scaling/run_scaling.sh --out %s first" % (out, out))
        return 1
    rows = []
    bad = 0
    for p in paths:
        got = load(p)
        bad += not got
        rows.extend(got)
    if not rows:
        warn("no usable run among %d JSON files" % len(paths))
        return 1
    add_scaling(rows)
    order = {"train": 0, "coll": 1}
    rows.sort(key=lambda r: (order[r["kind"]], r["config"], r["compress"], r["mode"], r["net"],
                             r["model"], r.get("op", ""), r["np"], r.get("bytes", 0)))
    csv_path = os.path.join(out, "scaling.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([fmt(r.get(c, "")) for c in COLUMNS])
    if "--quiet" not in argv:
        table(rows)
    print("collect: %d rows from %d of %d JSON files (%d skipped) -> %s"
          % (len(rows), len(paths) - bad, len(paths), bad, csv_path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
