#!/usr/bin/python3
# torch_attention.py — the PyTorch side of compute_perf's section (4): naive padded causal attention
# forward+backward in PyTorch on the same seeded batch, one thread. Optional; not part of CI.
"""Naive padded attention in PyTorch on compute_perf's (4) batch, for comparison.

Run with the Debian interpreter and its python3-torch (1.13):

    /usr/bin/python3 tests/bench/torch_attention.py [--iters N] [--threads N]
    /usr/bin/python3 tests/bench/torch_attention.py --lengths   # no torch needed

The batch: B=8 sequences, padded length T=1024, H=4 heads, D=64, causal. The sequence lengths
come from the generator compute_perf.c uses, reimplemented exactly:

    state = seed (104); for each sequence:
        state = (state * 6364136223846793005 + 1442695040888963407) mod 2^64
        draw  = state >> 33                      (the top 31 bits)
        length = 256 + draw % 749                (uniform in 256..1004, mean ~630)

which gives 881 601 390 583 831 879 349 528 (mean 630.25). Each sequence is padded to T; the
additive mask hides keys j > i (causal) and keys j >= length (padding); padding query rows get a
zero output gradient. Attention is softmax(Q K^T * D^-0.5 + mask) V with autograd for the
backward: the way a plain PyTorch model computes it, with every padded position paid for.
Prints the lengths and the median forward, backward and total milliseconds.
"""

import argparse
import statistics
import sys
import time

B, T, H, D = 8, 1024, 4, 64
SEED, LO, HI = 104, 256, 1004
MASK64 = (1 << 64) - 1


def lengths(seed=SEED, count=B, lo=LO, hi=HI):
    """compute_perf.c's draw_lengths: lo + draw % (hi - lo + 1) with its 64-bit LCG."""
    state, out = seed, []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
        out.append(lo + (state >> 33) % (hi - lo + 1))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5, help="timed runs (median reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    ap.add_argument("--lengths", action="store_true", help="print the lengths and exit")
    args = ap.parse_args()

    lens = lengths()
    print("lengths:", " ".join(str(n) for n in lens), "mean %.2f" % (sum(lens) / len(lens)))
    if args.lengths:
        return 0
    try:
        import torch
    except ImportError:
        print("torch_attention.py: torch is not importable here; on Debian 12: "
              "apt-get install python3-torch", file=sys.stderr)
        return 77

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    q = torch.rand(B, H, T, D) * 2 - 1
    k = torch.rand(B, H, T, D) * 2 - 1
    v = torch.rand(B, H, T, D) * 2 - 1
    dout = torch.rand(B, H, T, D) * 2 - 1
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(lens):
        valid[b, :n] = True
    dout = dout * valid[:, None, :, None]  # padding rows carry no gradient
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    visible = causal[None, :, :] & valid[:, None, :]  # (B, Tq, Tk)
    mask = torch.zeros(B, 1, T, T).masked_fill(~visible[:, None], float("-inf"))
    scale = D ** -0.5

    fwd_ms, bwd_ms = [], []
    for it in range(args.warmup + args.iters):
        qq = q.clone().requires_grad_(True)
        kk = k.clone().requires_grad_(True)
        vv = v.clone().requires_grad_(True)
        t0 = time.perf_counter()
        scores = torch.matmul(qq, kk.transpose(-2, -1)) * scale + mask
        out = torch.matmul(torch.softmax(scores, dim=-1), vv)
        t1 = time.perf_counter()
        out.backward(dout)
        t2 = time.perf_counter()
        if it >= args.warmup:
            fwd_ms.append((t1 - t0) * 1e3)
            bwd_ms.append((t2 - t1) * 1e3)
        if not (torch.isfinite(out).all() and torch.isfinite(qq.grad).all()):
            print("torch_attention.py: non-finite result", file=sys.stderr)
            return 1

    f, bw = statistics.median(fwd_ms), statistics.median(bwd_ms)
    print("torch %s, %d thread(s), naive padded causal attention B=%d T=%d H=%d D=%d:"
          % (torch.__version__, args.threads, B, T, H, D))
    print("fwd %.2f ms  bwd %.2f ms  total %.2f ms  (median of %d)" % (f, bw, f + bw, args.iters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
