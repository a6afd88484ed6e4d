#!/usr/bin/env python3
"""The reference side of bench_tokenize: Hugging Face `tokenizers` encoding
and decoding the same generated text, single thread.

  python3 hf_tokenize.py --corpus tests/tokenizer/corpus.json --mb 8 NAME=DIR...

The text is made exactly as bench/tokenize/main.c makes it: documents of 64
corpus strings picked by a 64-bit LCG, joined by a space or a newline, until
the total reaches the requested size."""
import argparse
import json
import os
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

M64 = (1 << 64) - 1


def make_docs(corpus, mb):
    x = 0x2545F4914F6CDD1D
    docs, total = [], 0
    while total < mb * 1000000:
        parts = []
        for _ in range(64):
            x = (x * 6364136223846793005 + 1442695040888963407) & M64
            parts.append(corpus[(x >> 33) % len(corpus)])
            parts.append("\n" if (x >> 20) & 1 else " ")
        d = "".join(parts)
        docs.append(d)
        total += len(d.encode("utf-8"))
    return docs, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("toks", nargs="+")
    a = ap.parse_args()
    with open(a.corpus, encoding="utf-8") as f:
        corpus = json.load(f)
    docs, nbytes = make_docs(corpus, a.mb)
    for spec in a.toks:
        name, d = spec.split("=", 1)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        for doc in docs[:16]:
            tok.encode(doc)
        t0 = time.perf_counter()
        encs = [tok.encode(doc).ids for doc in docs]
        t1 = time.perf_counter()
        ntok = sum(len(e) for e in encs)
        outb = 0
        for e in encs:
            outb += len(tok.decode(e, skip_special_tokens=False).encode("utf-8"))
        t2 = time.perf_counter()
        print(json.dumps({"impl": "hf-tokenizers " + tokenizers.__version__, "tokenizer": name,
                          "docs": len(docs), "bytes": nbytes, "tokens": ntok,
                          "encode_MBps": round(nbytes / (t1 - t0) / 1e6, 2),
                          "encode_tokps": round(ntok / (t1 - t0)),
                          "decode_MBps": round(outb / (t2 - t1) / 1e6, 2),
                          "decode_tokps": round(ntok / (t2 - t1))}), flush=True)


if __name__ == "__main__":
    main()
