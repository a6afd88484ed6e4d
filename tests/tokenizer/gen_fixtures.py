#!/usr/bin/env python3
"""Ground truth for the tokenizer tests, from Hugging Face's `tokenizers`.

For each tokenizer named on the command line (a folder holding its
tokenizer.json) and each string of corpus.json, write one JSON line
    [ids(add_special=True), ids(add_special=False),
     ids(add_special=False, special tokens' text not parsed) or null,
     decode(ids_add, skip_special_tokens=False),
     decode(ids_add, skip_special_tokens=True)]
after a header line {"tokenizers": version, "name": name, "n": count}.

  python3 gen_fixtures.py --corpus corpus.json --out DIR NAME=TOKDIR...
"""
import argparse
import json
import os

import tokenizers
from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("toks", nargs="+", help="NAME=DIR")
    a = ap.parse_args()
    with open(a.corpus, encoding="utf-8") as f:
        corpus = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    for spec in a.toks:
        name, d = spec.split("=", 1)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        has_raw = hasattr(raw, "encode_special_tokens")
        if has_raw:
            raw.encode_special_tokens = True
        path = os.path.join(a.out, name + ".jsonl")
        with open(path, "w", encoding="utf-8") as f:
            hdr = {"tokenizers": tokenizers.__version__, "name": name, "n": len(corpus)}
            f.write(json.dumps(hdr) + "\n")
            for s in corpus:
                ids = tok.encode(s, add_special_tokens=True).ids
                plain = tok.encode(s, add_special_tokens=False).ids
                nosplit = raw.encode(s, add_special_tokens=False).ids if has_raw else None
                dec = tok.decode(ids, skip_special_tokens=False)
                dec_skip = tok.decode(ids, skip_special_tokens=True)
                row = [ids, plain, nosplit, dec, dec_skip]
                f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(name, len(corpus), "strings ->", path, "tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
