#!/usr/bin/python3
# gpt_ddp.py — the PyTorch DDP peer of loom's train_gpt: a small byte-level GPT trained with
# AdamW on the Debian fortunes, torch.nn.parallel.DistributedDataParallel over gloo, one thread
# per rank. Optional benchmark; not part of CI.
"""PyTorch DDP peer of loom's train_gpt (byte-level GPT on the Debian fortunes, AdamW).

    /usr/bin/python3 tests/bench/peer/gpt_ddp.py --np 2 [--steps 300] [--json out.json]
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 tests/bench/peer/gpt_ddp.py

Model: vocabulary of the 256 byte values; token embedding + learned position embedding; --layers
pre-LayerNorm blocks (LN, causal self-attention with one QKV linear and an output projection, LN,
MLP width -> 4*width -> width with GELU, tanh approximation); final LN; an untied LM head
(its own width x 256 matrix, no bias; the token embedding is not reused). Every linear layer in
the blocks has a bias. Init as GPT-2/nanoGPT: normal(0, 0.02) for weights and embeddings,
0.02/sqrt(2*layers) for the two residual projections of each block, zero biases, LN 1/0.
Attention is computed explicitly (softmax(QK^T/sqrt(d) + causal mask) V): PyTorch 1.13 has no
fused or variable-length attention, so it does not stop at document boundaries.

Data: every regular file directly under /usr/share/games/fortunes except *.dat and *.u8, in
sorted order; a line holding only `%` separates documents; empty documents are dropped. The
documents are shuffled with loom's seeded Fisher-Yates (fmnist_permutation(n, --seed, 0)) and
the last 5% (n*5//100) of that order are validation. Each split is one byte stream, every
document followed by a 0 byte, cut into non-overlapping windows of ctx+1 bytes (input = first
ctx, target = last ctx). Training windows are reshuffled every epoch (fmnist_permutation(
windows, --seed, epoch)); global step s of an epoch takes windows [s*B*N, (s+1)*B*N) of that
order and rank r the r-th slice of B. Validation: the first --val-windows windows of the
validation stream, split over the ranks, mean loss over all their target bytes.

Optimizer: AdamW, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on matrices and embeddings (not
on biases or LayerNorm); learning rate as examples/train_gpt schedules it: linear warmup over
--warmup steps, then cosine decay to --min-lr-frac * --lr at the last step; the global gradient
norm clipped to --clip (torch.nn.utils.clip_grad_norm_). The defaults (no warmup, min-lr-frac
1, no clipping) give a constant --lr.

Throughput: tokens/s = training tokens of all ranks / training time (validation excluded).
MFU = achieved FLOP/s per rank / sgemm FLOP/s of one core, where achieved = tokens/s / N *
6 * (12*layers*width^2 + 256*width), 6 FLOPs per token per matrix-multiply weight, as
examples/train_gpt counts them (so the two MFUs compare like for like); mfu_palm uses the
PaLM/nanoGPT estimate 6*P + 12*layers*ctx*width (P = parameters without the position
embedding), which also counts attention over full windows. The sgemm rate is the best of 10 torch.mm of two 1024x1024 f32 matrices on one
thread, measured by every rank at the same time just before training (mean over ranks).
"""

import argparse
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402  (sets one thread per rank before torch loads)
from peer_common import dist, np, torch  # noqa: E402

F = torch.nn.functional
CORPUS_DIR = "/usr/share/games/fortunes"
VOCAB = 256


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=None,
                    help="ranks to spawn (default 1; ignored under torch.distributed.run)")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    ap.add_argument("--width", type=int, default=256, help="model width (default 256)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--ctx", type=int, default=256, help="context length in bytes (default 256)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank per step (default 8)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    ap.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (default 3e-4)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="linear warmup steps (default 0)")
    ap.add_argument("--min-lr-frac", type=float, default=1.0,
                    help="cosine decay ends at X * lr; 1 = constant (default 1)")
    ap.add_argument("--clip", type=float, default=0.0,
                    help="clip the global gradient norm to X, 0 = off (default 0)")
    ap.add_argument("--seed", type=int, default=42,
                    help="init, split and shuffle seed (default 42)")
    ap.add_argument("--val-every", type=int, default=100,
                    help="validation loss every N steps, 0 = only at the end (default 100)")
    ap.add_argument("--val-windows", type=int, default=64,
                    help="validation windows evaluated each time (default 64)")
    ap.add_argument("--log-every", type=int, default=10,
                    help="a progress line every N steps, 0 = none (default 10)")
    ap.add_argument("--data", default=CORPUS_DIR, help="directory of fortune files")
    ap.add_argument("--json", default=None, help="write the final numbers as JSON (rank 0)")
    a = ap.parse_args(argv)
    if min(a.layers, a.width, a.heads, a.ctx, a.batch, a.steps, a.val_windows) < 1 or \
            a.width % a.heads or a.val_every < 0 or a.log_every < 0 or a.warmup < 0 or \
            not 0.0 <= a.min_lr_frac <= 1.0 or a.clip < 0 or \
            (a.np is not None and a.np < 1):
        ap.error("sizes, --steps and --np want positive integers, --width a multiple of --heads")
    return a


# ---- data ----------------------------------------------------------------------------------------


def read_documents(path):
    """Documents of every fortune file under path, files in sorted order."""
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        sys.exit("gpt_ddp: cannot list %s: %s; install the corpus with `apt-get install "
                 "fortunes` (or pass --data DIR)" % (path, e))
    docs = []
    for name in names:
        full = os.path.join(path, name)
        if name.endswith((".dat", ".u8")) or not os.path.isfile(full):
            continue
        with open(full, "rb") as f:
            cur = []
            for line in f.read().splitlines(keepends=True):
                if line.rstrip(b"\n") == b"%":
                    docs.append(b"".join(cur))
                    cur = []
                else:
                    cur.append(line)
            docs.append(b"".join(cur))
    docs = [d for d in docs if d]
    if len(docs) < 20:
        sys.exit("gpt_ddp: %s holds %d documents; want at least 20" % (path, len(docs)))
    return docs


def split_corpus(docs, seed, ctx):
    """(train windows, val windows) as uint8 arrays of shape (n, ctx + 1)."""
    order = pc.loom_permutation(len(docs), seed, 0)
    n_val = max(1, len(docs) * 5 // 100)
    parts = []
    for ids in (order[:len(docs) - n_val], order[len(docs) - n_val:]):
        stream = b"".join(docs[i] + b"\0" for i in ids)
        n = len(stream) // (ctx + 1)
        if n < 1:
            sys.exit("gpt_ddp: a split of %d bytes has no window of %d" % (len(stream), ctx + 1))
        parts.append(np.frombuffer(stream, dtype=np.uint8)[:n * (ctx + 1)].reshape(n, ctx + 1))
    return parts[0], parts[1], len(docs) - n_val, n_val


# ---- model ---------------------------------------------------------------------------------------


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.fc_proj = torch.nn.Linear(4 * width, width)

    def attention(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = F.softmax(att.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, layers, width, heads, ctx):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, width)
        self.wpe = torch.nn.Embedding(ctx, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, VOCAB, bias=False)  # untied from wte
        # True above the diagonal: the future keys each query may not see. A plain attribute,
        # not a buffer, so that DDP has nothing to broadcast each step.
        self.mask = torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), diagonal=1)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                torch.nn.init.normal_(p, 0.0, std)
        # LayerNorm weights keep their init of 1.

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, dtype=torch.long))
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln_f(x))


def sgemm_gflops(reps=10):
    """Best of `reps` torch.mm of two 1024x1024 f32 matrices on this process's one thread."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    c = torch.empty(1024, 1024)
    for _ in range(2):
        torch.mm(a, b, out=c)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * 1024 ** 3 / best / 1e9


# ---- training ------------------------------------------------------------------------------------


def validate(model, val, n_windows, rank, world):
    """Mean loss over every target byte of the first n_windows validation windows."""
    n = min(n_windows, val.shape[0])
    begin, end = n * rank // world, n * (rank + 1) // world
    sums = torch.zeros(2, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for i in range(begin, end, 8):
            w = torch.from_numpy(val[i:min(end, i + 8)].astype(np.int64))
            logits = model(w[:, :-1])
            sums[0] += F.cross_entropy(logits.reshape(-1, VOCAB), w[:, 1:].reshape(-1),
                                       reduction="sum").item()
            sums[1] += w[:, 1:].numel()
    model.train()
    dist.all_reduce(sums)
    return sums[0].item() / sums[1].item()


def worker(rank, world, a):
    t_start = time.perf_counter()
    docs = read_documents(a.data)
    train, val, n_train_docs, n_val_docs = split_corpus(docs, a.seed, a.ctx)
    per_epoch = train.shape[0] // (a.batch * world)
    if per_epoch < 1:
        sys.exit("gpt_ddp: --batch %d on %d ranks exceeds the %d training windows"
                 % (a.batch, world, train.shape[0]))

    torch.manual_seed(a.seed)
    model = GPT(a.layers, a.width, a.heads, a.ctx)
    n_params = sum(p.numel() for p in model.parameters())
    p_flops = n_params - model.wpe.weight.numel()
    flops_per_token = 6 * (12 * a.layers * a.width * a.width + 256 * a.width)
    palm_flops_per_token = 6 * p_flops + 12 * a.layers * a.ctx * a.width
    ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    dist.barrier()
    gflops = torch.tensor([sgemm_gflops()], dtype=torch.float64)
    dist.all_reduce(gflops)
    gflops = gflops.item() / world
    if rank == 0:
        print("gpt_ddp: %d rank(s), torch %s, %d layers, width %d, %d heads, ctx %d, batch %d "
              "per rank (global %d), AdamW lr %g, %d steps"
              % (world, torch.__version__, a.layers, a.width, a.heads, a.ctx, a.batch,
                 a.batch * world, a.lr, a.steps))
        print("params %d (%d without the position embedding), %.2f MFLOP per token (PaLM "
              "estimate %.2f), sgemm 1024^3 on one thread %.1f GFLOP/s"
              % (n_params, p_flops, flops_per_token / 1e6, palm_flops_per_token / 1e6, gflops))
        print("data: %s: %d documents (%d train, %d val), %d train windows of %d bytes, %d val "
              "windows (%d used), %d steps/epoch" % (a.data, len(docs), n_train_docs, n_val_docs,
                                                    train.shape[0], a.ctx + 1, val.shape[0],
                                                    min(a.val_windows, val.shape[0]), per_epoch),
              flush=True)

    tokens_per_step = a.batch * a.ctx * world
    val_loss = float("nan")
    val_time = 0.0
    log_sum, log_from = torch.zeros((), dtype=torch.float64), 0
    train_loss = float("nan")
    perm, perm_epoch = None, -1
    t0 = tlog = time.perf_counter()
    val_since_log = 0.0
    for step in range(a.steps):
        epoch, s = divmod(step, per_epoch)
        if epoch != perm_epoch:
            perm, perm_epoch = pc.loom_permutation(train.shape[0], a.seed, epoch), epoch
        first = (s * world + rank) * a.batch
        w = torch.from_numpy(train[perm[first:first + a.batch]].astype(np.int64))
        logits = ddp(w[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients over the ranks during the backward
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        log_sum += loss.detach()
        done = step + 1
        if a.log_every > 0 and (done % a.log_every == 0 or done == a.steps):
            dist.all_reduce(log_sum)
            train_loss = log_sum.item() / world / (done - log_from)
            now = time.perf_counter()
            if rank == 0:
                print("  step %d/%d  loss %.4f  tokens/s %.0f" % (
                    done, a.steps, train_loss,
                    (done - log_from) * tokens_per_step / (now - tlog - val_since_log)),
                    flush=True)
            tlog, log_from, val_since_log = now, done, 0.0
            log_sum = torch.zeros((), dtype=torch.float64)
        if (a.val_every > 0 and done % a.val_every == 0) or done == a.steps:
            tv = time.perf_counter()
            val_loss = validate(model, val, a.val_windows, rank, world)
            dv = time.perf_counter() - tv
            val_time += dv
            val_since_log += dv
            if rank == 0:
                print("  step %d/%d  val_loss %.4f  (%.1f s)" % (done, a.steps, val_loss, dv),
                      flush=True)
    if a.log_every == 0:  # the last step's loss, averaged over the ranks
        dist.all_reduce(log_sum.zero_().add_(loss.detach()))
        train_loss = log_sum.item() / world
    train_time = time.perf_counter() - t0 - val_time
    tokens_per_s = a.steps * tokens_per_step / train_time
    mfu = tokens_per_s / world * flops_per_token / (gflops * 1e9)
    mfu_palm = tokens_per_s / world * palm_flops_per_token / (gflops * 1e9)
    wall = time.perf_counter() - t_start
    if rank == 0:
        print("total: %d steps, %.0f tokens/s over %.1f s of training, train_loss %.4f, "
              "val_loss %.4f, MFU %.3f (%.1f GFLOP/s per rank of %.1f), wall %.1f s"
              % (a.steps, tokens_per_s, train_time, train_loss, val_loss, mfu,
                 tokens_per_s / world * flops_per_token / 1e9, gflops, wall), flush=True)
        if a.json:
            pc.write_json(a.json, {
                "tokens_per_s": round(tokens_per_s, 1), "val_loss": val_loss,
                "train_loss": train_loss, "mfu": mfu, "mfu_palm": mfu_palm, "sgemm_gflops": gflops,
                "steps": a.steps, "np": world, "wall_s": wall, "train_time_s": train_time,
                "params": n_params, "flops_per_token": flops_per_token,
                "palm_flops_per_token": palm_flops_per_token, "layers": a.layers,
                "width": a.width, "heads": a.heads, "ctx": a.ctx, "batch": a.batch,
                "lr": a.lr, "warmup": a.warmup, "min_lr_frac": a.min_lr_frac, "clip": a.clip,
                "seed": a.seed, "val_windows": min(a.val_windows, val.shape[0]),
                "torch": torch.__version__, "threads_per_rank": 1})


def lr_at(a, step):
    """examples/train_gpt's schedule: linear warmup, then cosine to min_lr_frac * lr."""
    if a.warmup > 0 and step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    span = max(a.steps - a.warmup, 1)
    progress = (step - a.warmup) / span
    min_lr = a.lr * a.min_lr_frac
    return min_lr + (a.lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def main():
    a = parse_args()
    pc.launch(worker, a, a.np)
    return 0


if __name__ == "__main__":
    sys.exit(main())
