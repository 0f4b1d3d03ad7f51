# peer_common.py — what the two PyTorch DDP peers share: one thread per rank, the launcher (one
# process, torch.multiprocessing spawn, or torch.distributed.run), loom's splitmix64 streams
# (for the same init and the same seeded shuffle as loom's examples), and the JSON writer.
"""Shared helpers for fmnist_ddp.py and gpt_ddp.py (see README.md)."""

import json
import os
import socket
import sys

# One thread per rank, set before torch (and its BLAS) is imported anywhere in this process; the
# spawned ranks inherit the environment.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402  (after the thread settings on purpose)

try:
    import torch  # noqa: E402
    import torch.distributed as dist  # noqa: E402
    import torch.multiprocessing as mp  # noqa: E402
except ImportError:  # pragma: no cover - depends on the machine
    sys.stderr.write(
        "%s: PyTorch is not importable by %s. On Debian 12: `apt-get install python3-torch` and "
        "run the script with /usr/bin/python3.\n" % (os.path.basename(sys.argv[0]), sys.executable)
    )
    sys.exit(3)

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1


# ---- loom's splitmix64, vectorised ---------------------------------------------------------------


def splitmix64_stream(state, count):
    """The first `count` outputs of loom's splitmix64 from `state` (uint64 array).

    loom's generator adds GOLDEN to the state before mixing, so output k (1-based) is
    mix(state + k * GOLDEN) and the whole stream can be computed at once.
    """
    k = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(state & MASK64) + k * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def loom_permutation(n, seed, epoch):
    """fmnist_permutation (examples/fmnist_data.c): Fisher-Yates over 0..n-1 from
    state = seed * 0x2545f4914f6cdd1d + epoch * GOLDEN + 1, drawing j = next % (i + 1)
    for i = n-1 down to 1. The same (n, seed, epoch) gives loom's order exactly."""
    state = (seed * 0x2545F4914F6CDD1D + epoch * GOLDEN + 1) & MASK64
    perm = list(range(n))
    if n < 2:
        return np.array(perm, dtype=np.int64)
    draws = splitmix64_stream(state, n - 1)
    bounds = np.arange(n, 1, -1, dtype=np.uint64)  # i + 1 for i = n-1 .. 1
    js = (draws % bounds).tolist()
    for i, j in zip(range(n - 1, 0, -1), js):
        perm[i], perm[j] = perm[j], perm[i]
    return np.array(perm, dtype=np.int64)


# ---- threads, process group, launch --------------------------------------------------------------


def one_thread():
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _run_rank(rank, world, fn, args):
    """One rank: one thread, a gloo group over loopback, fn, then the group torn down."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    one_thread()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, args)
    finally:
        dist.destroy_process_group()


def _entry(rank, world, port, fn, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    _run_rank(rank, world, fn, args)


def launch(fn, args, np_flag):
    """Run fn(rank, world, args) on every rank with a gloo group on 127.0.0.1.

    Under torch.distributed.run (RANK and WORLD_SIZE set) this process is one rank. Otherwise
    --np N ranks: N == 1 runs here, N > 1 spawns N processes with torch.multiprocessing.
    """
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if np_flag not in (None, world):
            sys.stderr.write("--np %d ignored: the launcher started %d ranks\n" % (np_flag, world))
        _run_rank(rank, world, fn, args)
        return
    world = np_flag or 1
    port = free_port()
    if world == 1:
        _entry(0, 1, port, fn, args)
    else:
        mp.spawn(_entry, args=(world, port, fn, args), nprocs=world, join=True)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=None)
        f.write("\n")
