#!/usr/bin/env python3
"""The demo model's corpus: the King James Version of the Bible, from
Debian's bible-kjv-text package (read with its bible-kjv program), split by
chapter into a training part and a held-out part.

  corpus.py --out DIR [--dump FILE]

Writes DIR/train.txt, DIR/heldout.txt and DIR/split.json. Each chapter is one
document: a heading line ("Genesis 1") and then one verse a line, verse
numbers dropped; documents are separated by one blank line. Chapter k (0 for
Genesis 1, in canonical order, 1189 chapters) is held out when
k % HOLDOUT_EVERY == HOLDOUT_AT, so the held-out part samples every book's
style without sharing a chapter with the training part.

--dump FILE reads the text bible-kjv printed earlier ("bible -l0
gen1:1-rev22:21") instead of running it. Python's standard library only.

Licence: the KJV text is in the public domain (its copyright expired; see
/usr/share/doc/bible-kjv-text/copyright). The bible-kjv program is GPL-2+ and
is only run here, never shipped.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

HOLDOUT_EVERY = 20
HOLDOUT_AT = 10
HEADING = re.compile(r"^([1-3] )?[A-Z][A-Za-z ]* [0-9]+$")
VERSE = re.compile(r"^ +[0-9]+ (.*)$")


def chapters(text):
    """[(heading, [verse, ...]), ...] in the order printed."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if HEADING.match(line):
            out.append((line.strip(), []))
            continue
        m = VERSE.match(line)
        if not m or not out:
            sys.exit(f"corpus.py: unexpected line {line[:60]!r}")
        out[-1][1].append(m.group(1).strip())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump")
    a = ap.parse_args()
    if a.dump:
        with open(a.dump, encoding="ascii") as f:
            text = f.read()
    else:
        text = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], check=True,
                              capture_output=True, text=True).stdout
    ch = chapters(text)
    if len(ch) != 1189:
        sys.exit(f"corpus.py: {len(ch)} chapters, expected 1189")
    os.makedirs(a.out, exist_ok=True)
    parts = {"train": [], "heldout": []}
    for k, (head, verses) in enumerate(ch):
        part = "heldout" if k % HOLDOUT_EVERY == HOLDOUT_AT else "train"
        parts[part].append(head + "\n" + "\n".join(verses) + "\n")
    split = {"source": "Debian bible-kjv-text (King James Version, public domain), "
                       "printed by bible-kjv: bible -l0 gen1:1-rev22:21",
             "documents": "one per chapter: heading line, then one verse a line",
             "heldout_rule": f"chapter k (0-based, canonical order) where k % {HOLDOUT_EVERY} == "
                        f"{HOLDOUT_AT}",
             "chapters": len(ch)}
    for name, docs in parts.items():
        body = "\n".join(docs)
        with open(os.path.join(a.out, name + ".txt"), "w", encoding="ascii") as f:
            f.write(body)
        split[name] = {"chapters": len(docs), "bytes": len(body),
                       "sha256": hashlib.sha256(body.encode()).hexdigest()}
    with open(os.path.join(a.out, "split.json"), "w") as f:
        json.dump(split, f, indent=1)
        f.write("\n")
    print(json.dumps(split, indent=1))


if __name__ == "__main__":
    main()
