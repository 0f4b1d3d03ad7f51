#!/usr/bin/env python3
"""make_corpus.py — write the seed corpora of the libFuzzer targets (tests/fuzz/corpus/<target>/):
a few valid inputs each, in the input layout each target's comment describes. Run it again after
a format change: python3 tests/fuzz/make_corpus.py"""
import math
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- fuzz_codec_decode: kind, ratio byte, n (u16 LE), seed, odd; then the payload ------------
KINDS = ["none", "fp16", "bf16", "int8", "topk", "randomk", "efsign"]  # codec enum = index + 1
MAGIC, VERSION, NONFINITE = 0x4C4D, 1, 1


def header(kind, n, flags=0):
    return struct.pack("<HBBIQ", MAGIC, KINDS.index(kind) + 1, VERSION, flags, n)


def keep(ratio, n):  # loom_codec_keep
    if n <= 0:
        return 0
    k = math.ceil(ratio * n * (1.0 - 1e-12))
    return min(max(k, 1), n)


def codec_seed(kind, n, body, ratio_byte=63, seed=7, odd=0, flags=0):
    prefix = bytes([KINDS.index(kind), ratio_byte, n & 0xFF, n >> 8, seed, odd])
    return prefix + header(kind, n, flags) + body


def codec_corpus():
    for n in (0, 8, 13):
        xs = [0.5 * i - 2.0 for i in range(n)]
        write("fuzz_codec_decode", f"none_n{n}", codec_seed("none", n, struct.pack(f"<{n}f", *xs)))
        write("fuzz_codec_decode", f"fp16_n{n}", codec_seed("fp16", n, struct.pack(f"<{n}e", *xs)))
        bf = b"".join(struct.pack("<f", x)[2:] for x in xs)
        write("fuzz_codec_decode", f"bf16_n{n}_odd", codec_seed("bf16", n, bf, odd=1))
        q = [((i * 37) % 255) - 127 for i in range(n)]
        write("fuzz_codec_decode", f"int8_n{n}",
              codec_seed("int8", n, struct.pack("<f", 0.01) + struct.pack(f"<{n}b", *q)))
        ratio_byte = 63  # (63 + 1) / 256 = 0.25
        k = keep((ratio_byte + 1) / 256.0, n)
        idx = [i * (n // k) for i in range(k)] if k else []
        write("fuzz_codec_decode", f"topk_n{n}",
              codec_seed("topk", n, struct.pack(f"<{k}I", *idx) + struct.pack(f"<{k}f", *xs[:k])))
        write("fuzz_codec_decode", f"randomk_n{n}",
              codec_seed("randomk", n, struct.pack(f"<{k}f", *xs[:k]), seed=n))
        bits = bytearray((n + 7) // 8)
        for i, x in enumerate(xs):
            if x < 0:
                bits[i // 8] |= 1 << (i % 8)
        write("fuzz_codec_decode", f"efsign_n{n}",
              codec_seed("efsign", n, struct.pack("<f", 1.25) + bytes(bits)))
    write("fuzz_codec_decode", "int8_nonfinite", codec_seed("int8", 8, b"", flags=NONFINITE))


# ---- fuzz_tunables: tunable index (table order), then the text -------------------------------
TUNABLES = ["WARN", "INIT,COLL", "/tmp/loom.%h.%p.log", "numa", "4", "auto", "2", "2", "inplace",
            "1048576", "/tmp/timeline.%r.json", "20000", "1000", "topk:0.01", "12.5", "1e3",
            "4194304", "coarse"]


def tunables_corpus():
    for i, text in enumerate(TUNABLES):
        write("fuzz_tunables", f"p{i:02d}", bytes([i]) + text.encode())
    write("fuzz_tunables", "subsys_exclude", bytes([1]) + b"^MOE,attn")
    write("fuzz_tunables", "gpu_index", bytes([5]) + b" 3 ")
    for i, spec in enumerate(("int8:sr", "powersgd:4", "randomk:0.07", "efsign", "bf16")):
        write("fuzz_tunables", f"compress{i}", bytes([13]) + spec.encode())


# ---- fuzz_attn_msg: phase, ntasks, nfloats (int64 LE); then the message ----------------------
ATTN_MAGIC = 0x4E5454414D4F4F4C  # "LOOMATTN"


def attn_seed(phase, ntasks, nfloats, hdr=None):
    h = hdr if hdr is not None else (ATTN_MAGIC, phase, ntasks, nfloats)
    body = struct.pack(f"<{nfloats}f", *[0.125 * i for i in range(nfloats)])
    return struct.pack("<BBq", phase, ntasks, nfloats) + struct.pack("<4Q", *h) + body


def attn_corpus():
    write("fuzz_attn_msg", "ship", attn_seed(1, 2, 12))
    write("fuzz_attn_msg", "return", attn_seed(2, 1, 5))
    write("fuzz_attn_msg", "bship_empty", attn_seed(3, 0, 0))
    write("fuzz_attn_msg", "failed_peer", attn_seed(4, 3, 0, hdr=(ATTN_MAGIC, 4, 0, 0)))


# ---- fuzz_moe_msg: np - 1, el - 1, chunks - 1, width - 1 (3 bytes LE); then int64 LE counts ---


def moe_seed(np_, el, chunks, width, counts):
    assert len(counts) == np_ * el
    w = width - 1
    return bytes([np_ - 1, el - 1, chunks - 1, w & 0xFF, (w >> 8) & 0xFF, w >> 16]) + \
        struct.pack(f"<{len(counts)}q", *counts)


def moe_corpus():
    write("fuzz_moe_msg", "np2_el2", moe_seed(2, 2, 4, 256, [3, 0, 5, 7]))
    write("fuzz_moe_msg", "np1_el4", moe_seed(1, 4, 1, 896, [10, 20, 0, 1]))
    write("fuzz_moe_msg", "np4_el1_empty", moe_seed(4, 1, 2, 64, [0, 0, 0, 0]))
    write("fuzz_moe_msg", "np3_el2", moe_seed(3, 2, 3, 1 << 24, [1, 2, 3, 4, 5, 6]))


# ---- fuzz_timeline: a rank's Chrome trace as LOOM_TIMELINE writes it, and an earlier merge ------
def timeline_corpus():
    write("fuzz_timeline", "rank0.json",
          b'{"traceEvents":[\n{"name":"fwd","ph":"X","pid":0,"tid":1,"ts":10.5,"dur":3,'
          b'"args":{"bytes":4096,"tensors":["a","b"]}},\n'
          b'{"name":"process_name","ph":"M","pid":0,"args":{"name":"rank 0"}}\n],'
          b'"otherData":{"step":1}}\n')
    write("fuzz_timeline", "merged.json",
          b'{"traceEvents":[{"pid":1,"s":"\\u00e9\\n\xc3\xa9"},{"pid":-2,"e":[1e-3,true,null]}],'
          b'"otherData":{"loom_timeline_merge":2}}')


# ---- fuzz_fmnist: u32 LE length of the images file, the images file, the labels file ----------
def fmnist_corpus():
    import gzip
    n = 2
    img = struct.pack(">IIII", 2051, n, 28, 28) + bytes((i * 7) % 256 for i in range(n * 784))
    lab = struct.pack(">II", 2049, n) + bytes([3, 9])
    write("fuzz_fmnist", "plain", struct.pack("<I", len(img)) + img + lab)
    gi, gl = gzip.compress(img, mtime=0), gzip.compress(lab, mtime=0)
    write("fuzz_fmnist", "gzip", struct.pack("<I", len(gi)) + gi + gl)


if __name__ == "__main__":
    codec_corpus()
    tunables_corpus()
    attn_corpus()
    moe_corpus()
    timeline_corpus()
    fmnist_corpus()
