#!/usr/bin/python3
# fmnist_ddp.py — the PyTorch DDP peer of examples/train_fmnist.c: the same MLP, init, data,
# shuffle, sharding and optimizer, trained with torch.nn.parallel.DistributedDataParallel over
# gloo, one thread per rank. Optional benchmark; not part of CI.
"""PyTorch DDP peer of loom's train_fmnist (Fashion-MNIST MLP, SGD with momentum).

    /usr/bin/python3 tests/bench/peer/fmnist_ddp.py --np 2 [--epochs 3] [--json out.json]
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 tests/bench/peer/fmnist_ddp.py

Matches train_fmnist's defaults: MLP 784-1024-1024-10 with GELU (tanh approximation), weights
and biases uniform in +-1/sqrt(fan_in) drawn from loom's splitmix64 streams (the same numbers as
loom for the same --seed), pixels /255 then normalised by the mean and std of all training
pixels, the global batch of --batch * N samples taken from one seeded shuffle per epoch (loom's
fmnist_permutation; rank r takes the r-th slice; the tail of an epoch is dropped), SGD with
momentum 0.9 (dampening 0, no weight decay), lr 0.05 with cosine decay to 0 over the run.
samples/s counts training samples over training time only (the test evaluation is excluded).
"""

import argparse
import gzip
import math
import os
import struct
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ next to the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402  (sets one thread per rank before torch loads)
from peer_common import dist, np, torch  # noqa: E402

DATA_DIR = "/usr/share/datasets/fashion-mnist"
PIXELS, CLASSES = 784, 10


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=None,
                    help="ranks to spawn (default 1; ignored under torch.distributed.run)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs to train (default 3)")
    ap.add_argument("--steps", type=int, default=0,
                    help="stop after N optimizer steps in total, 0 = no limit (default 0)")
    ap.add_argument("--batch", type=int, default=128,
                    help="samples per rank per step (default 128)")
    ap.add_argument("--lr", type=float, default=0.05, help="peak learning rate (default 0.05)")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden width (default 1024)")
    ap.add_argument("--seed", type=int, default=42, help="init and shuffle seed (default 42)")
    ap.add_argument("--data", default=DATA_DIR, help="directory of the IDX .gz files")
    ap.add_argument("--log-every", type=int, default=0,
                    help="a progress line every N steps, 0 = per epoch only (default 0)")
    ap.add_argument("--json", default=None, help="write the final numbers as JSON (rank 0)")
    a = ap.parse_args(argv)
    if a.epochs < 1 or a.batch < 1 or a.steps < 0 or (a.np is not None and a.np < 1):
        ap.error("--epochs, --batch and --np want positive integers, --steps >= 0")
    return a


# ---- data ----------------------------------------------------------------------------------------


def read_idx(path, magic, ndim):
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        sys.exit("fmnist_ddp: cannot read %s: %s; install it with `apt-get install "
                 "dataset-fashion-mnist` or pass --data DIR" % (path, e))
    hdr = 4 + 4 * ndim
    if len(raw) < hdr:
        sys.exit("fmnist_ddp: %s: truncated header" % path)
    fields = struct.unpack(">%dI" % (1 + ndim), raw[:hdr])
    if fields[0] != magic:
        sys.exit("fmnist_ddp: %s: bad magic %d, want %d" % (path, fields[0], magic))
    dims = fields[1:]
    if len(raw) - hdr != int(np.prod(dims)):
        sys.exit("fmnist_ddp: %s: %d payload bytes, header says %s" % (path, len(raw) - hdr, dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=hdr).reshape(dims)


def load_split(data, split):
    x = read_idx("%s/%s-images-idx3-ubyte.gz" % (data, split), 2051, 3)
    y = read_idx("%s/%s-labels-idx1-ubyte.gz" % (data, split), 2049, 1)
    if x.shape[0] != y.shape[0] or x.shape[1:] != (28, 28) or y.max() >= CLASSES:
        sys.exit("fmnist_ddp: %s: images %s and labels %s do not match" % (split, x.shape, y.shape))
    # pixel / 255 in f32, as fmnist_data.c
    return x.reshape(-1, PIXELS).astype(np.float32) / np.float32(255.0), y.astype(np.int64)


def pixel_stats(x):
    """fmnist_stats: mean and std over every pixel, summed in double."""
    total = x.size
    s = float(x.sum(dtype=np.float64))
    sq = float(np.square(x, dtype=np.float64).sum())
    m = s / total
    var = sq / total - m * m
    return np.float32(m), np.float32(math.sqrt(var)) if var > 1e-12 else np.float32(1.0)


# ---- model ---------------------------------------------------------------------------------------


def make_model(hidden, seed):
    model = torch.nn.Sequential(
        torch.nn.Linear(PIXELS, hidden), torch.nn.GELU(approximate="tanh"),
        torch.nn.Linear(hidden, hidden), torch.nn.GELU(approximate="tanh"),
        torch.nn.Linear(hidden, CLASSES))
    # train_fmnist's mlp_init: parameter i (w1 b1 w2 b2 w3 b3) from the splitmix64 stream of
    # state seed * GOLDEN + i + 1, u = top 24 bits / 2^24, value (2u - 1) / sqrt(fan_in), in f32.
    params = [model[0].weight, model[0].bias, model[2].weight, model[2].bias,
              model[4].weight, model[4].bias]
    with torch.no_grad():
        for i, p in enumerate(params):
            fan_in = PIXELS if i < 2 else hidden
            bound = np.float32(1.0) / np.sqrt(np.float32(fan_in))
            state = (seed * pc.GOLDEN + i + 1) & pc.MASK64
            bits = pc.splitmix64_stream(state, p.numel()) >> np.uint64(40)
            u = bits.astype(np.float32) / np.float32(1 << 24)
            vals = (np.float32(2.0) * u - np.float32(1.0)) * bound
            p.copy_(torch.from_numpy(vals.reshape(tuple(p.shape))))
    return model


def lr_at(lr, step, total):
    """train_fmnist's lr_at without warmup: cosine from lr to 0 over `total` steps."""
    return lr * 0.5 * (1.0 + math.cos(math.pi * step / max(total, 1)))


# ---- training ------------------------------------------------------------------------------------


def evaluate(model, x, y, rank, world, cap):
    """Test accuracy and mean loss: each rank a contiguous slice, sums reduced over ranks."""
    n = x.shape[0]
    begin, end = n * rank // world, n * (rank + 1) // world
    sums = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(begin, end, cap):
            xb, yb = x[i:min(end, i + cap)], y[i:min(end, i + cap)]
            logits = model(xb)
            sums[1] += torch.nn.functional.cross_entropy(logits, yb, reduction="sum").item()
            sums[0] += (logits.argmax(dim=1) == yb).sum().item()
    dist.all_reduce(sums)
    return sums[0].item() / n, sums[1].item() / n


def worker(rank, world, a):
    t_start = time.perf_counter()
    xtr, ytr = load_split(a.data, "train")
    xte, yte = load_split(a.data, "t10k")
    mean, std = pixel_stats(xtr)
    inv = np.float32(1.0) / std
    xtr = torch.from_numpy((xtr - mean) * inv)
    xte = torch.from_numpy((xte - mean) * inv)
    ytr, yte = torch.from_numpy(ytr), torch.from_numpy(yte)
    n = xtr.shape[0]
    per_epoch = n // (a.batch * world)
    if per_epoch < 1:
        sys.exit("fmnist_ddp: --batch %d on %d ranks exceeds the %d training samples"
                 % (a.batch, world, n))
    total = per_epoch * a.epochs
    if 0 < a.steps < total:
        total = a.steps

    model = make_model(a.hidden, a.seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)
    if rank == 0:
        print("fmnist_ddp: %d rank(s), torch %s, batch %d per rank (global %d), MLP 784-%d-%d-10 "
              "GELU(tanh), lr %g cosine, momentum %g, %d steps/epoch, %d steps"
              % (world, torch.__version__, a.batch, a.batch * world, a.hidden, a.hidden, a.lr,
                 a.momentum, per_epoch, total))
        print("data: %s: %d train, %d test, pixel mean %.4f std %.4f"
              % (a.data, n, xte.shape[0], mean, std), flush=True)

    step, epoch, train_time = 0, 0, 0.0
    epoch_loss = acc = test_loss = float("nan")
    while step < total:
        perm = torch.from_numpy(pc.loom_permutation(n, a.seed, epoch))
        loss_sum = torch.zeros((), dtype=torch.float64)
        log_sum, log_from = torch.zeros((), dtype=torch.float64), step
        t0 = tlog = time.perf_counter()
        s = 0
        while s < per_epoch and step < total:
            first = (s * world + rank) * a.batch
            idx = perm[first:first + a.batch]
            xb, yb = xtr.index_select(0, idx), ytr.index_select(0, idx)
            for g in opt.param_groups:
                g["lr"] = lr_at(a.lr, step, total)
            loss = torch.nn.functional.cross_entropy(ddp(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # DDP averages the gradients over the ranks during the backward
            opt.step()
            loss_sum += loss.detach()
            log_sum += loss.detach()
            s += 1
            step += 1
            if a.log_every > 0 and step % a.log_every == 0:
                dist.all_reduce(log_sum)
                now = time.perf_counter()
                if rank == 0:
                    print("  step %d/%d  epoch %d  loss %.4f  lr %.4f  samples/s %.0f"
                          % (step, total, epoch + 1, log_sum.item() / world / (step - log_from),
                             lr_at(a.lr, step - 1, total),
                             (step - log_from) * a.batch * world / (now - tlog)), flush=True)
                tlog, log_sum, log_from = now, torch.zeros((), dtype=torch.float64), step
        dt = time.perf_counter() - t0
        train_time += dt
        dist.all_reduce(loss_sum)  # the mean over ranks of each step's loss, as loom logs it
        epoch_loss = loss_sum.item() / world / s
        acc, test_loss = evaluate(model, xte, yte, rank, world, a.batch)
        epoch += 1
        if rank == 0:
            print("epoch %d  train_loss %.4f  test_loss %.4f  test_acc %.4f  samples/s %.0f  "
                  "(%.1f s)" % (epoch, epoch_loss, test_loss, acc, s * a.batch * world / dt, dt),
                  flush=True)
    samples_per_s = step * a.batch * world / train_time
    wall = time.perf_counter() - t_start
    if rank == 0:
        print("total: %d steps, %.0f samples/s over %.1f s of training, test_acc %.4f, wall %.1f s"
              % (step, samples_per_s, train_time, acc, wall), flush=True)
        if a.json:
            pc.write_json(a.json, {
                "samples_per_s": round(samples_per_s, 1), "test_acc": acc,
                "train_loss": epoch_loss, "test_loss": test_loss, "epochs": epoch,
                "steps": step, "np": world, "batch": a.batch, "global_batch": a.batch * world,
                "hidden": a.hidden, "lr": a.lr, "seed": a.seed, "train_time_s": train_time,
                "wall_s": wall, "torch": torch.__version__, "threads_per_rank": 1})


def main():
    a = parse_args()
    pc.launch(worker, a, a.np)
    return 0


if __name__ == "__main__":
    sys.exit(main())
