#!/usr/bin/env python3
"""Ground truth for the tokenizer tests, from Hugging Face's `tokenizers`.

For each tokenizer named on the command line (a folder holding its
tokenizer.json) and each string of corpus.json, write one JSON line
    [ids(add_special=True), ids(add_special=False),
     ids(add_special=False, special tokens' text not parsed) or null,
     decode(ids_add, skip_special_tokens=False),
     decode(ids_add, skip_special_tokens=True)]
after a header line {"tokenizers": version, "name": name, "n": count}.

  python3 gen_fixtures.py --corpus corpus.json [--variants variants.json] \
      --out DIR NAME=TOKDIR...

With --variants, also each variant of variants.json: its base tokenizer's
tokenizer.json with the listed changes (apply_variant below; the C test
applies the same changes).
"""
import argparse
import json
import os

import tokenizers
from tokenizers import Tokenizer


def apply_variant(j, v):
    """The changes of one variant, applied to the parsed tokenizer.json j."""
    for k, val in v.get("set", {}).items():
        j[k] = val
    for k, val in v.get("model_set", {}).items():
        j["model"][k] = val
    for upd in v.get("added_tokens_update", []):
        for t in j["added_tokens"]:
            if t["content"] == upd["content"]:
                t.update(upd)
    j["added_tokens"].extend(v.get("added_tokens_append", []))
    return j


def write_fixture(path, name, tok, raw, corpus):
    has_raw = hasattr(raw, "encode_special_tokens")
    if has_raw:
        raw.encode_special_tokens = True
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants")
    ap.add_argument("toks", nargs="+", help="NAME=DIR")
    a = ap.parse_args()
    with open(a.corpus, encoding="utf-8") as f:
        corpus = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    dirs = {}
    for spec in a.toks:
        name, d = spec.split("=", 1)
        dirs[name] = d
        path = os.path.join(a.out, name + ".jsonl")
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        write_fixture(path, name, tok, raw, corpus)
    if a.variants:
        with open(a.variants, encoding="utf-8") as f:
            variants = json.load(f)
        for v in variants:
            with open(os.path.join(dirs[v["base"]], "tokenizer.json"), encoding="utf-8") as f:
                text = json.dumps(apply_variant(json.load(f), v))
            path = os.path.join(a.out, v["name"] + ".jsonl")
            write_fixture(path, v["name"], Tokenizer.from_str(text), Tokenizer.from_str(text),
                          corpus)

if __name__ == "__main__":
    main()
