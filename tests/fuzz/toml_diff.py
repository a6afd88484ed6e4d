#!/usr/bin/env python3
"""Differential test of the TOML reader against Python's tomllib (TOML 1.0).

    toml_diff.py TOML_DUMP CORPUS_DIR [ITERATIONS]

Runs the seed corpus, a list of edge cases and ITERATIONS deterministic
mutations of them through both readers. Where tomllib accepts a document
within int4serve's subset, the reader must accept it with the same values;
where tomllib rejects one, the reader must reject it too. Documents outside
the subset (dates and times, inline tables, arrays of tables, multi-line
strings, nested arrays, non-decimal integers, U+0000) must be rejected with
a "not supported" message, or, for dates, times and integers beyond 64 bits
(which TOML says must be an error; tomllib takes them), rejected at all.
Floats beyond binary64 are refused ("float is out of range") where tomllib
makes them infinite.
Exits 1 on the first few disagreements, printing them.
"""
import math
import os
import random
import subprocess
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    print("SKIPPED: tomllib needs Python 3.11")
    sys.exit(0)

import datetime
import json

EDGE_CASES = [
    b"a = 1\n", b"a=1", b"a = +0\nb = -0\n", b"a = 00\n", b"a = 0.5\nb = 00.5\n",
    b"a = 1e05\nb = 1e1_0\nc = 1.0_1\nd = 1_0.0\n", b"a = 1__0\n", b"a = _1\n",
    b"a = 1.e5\n", b"a = 1.5E+3\nb = -2e-2\n", b"a = +inf\nb = -nan\nc = inf\n",
    b"a = -0x1\n", b"a = 0x1F\n", b"a = 0o17\n", b"a = 0b101\n",
    b"a = 9223372036854775807\n", b"a = 9223372036854775808\n",
    b"a = -9223372036854775808\n", b"a = 1e400\n", b"a = 1e-400\n",
    b"\"\" = 1\n", b"'' = 1\n", b" = 1\n", b"a.b.c = 1\n", b"a . b = 1\n",
    b"a.b = 1\na.c = 2\n", b"a.b = 1\na = 2\n", b"a = 1\na.b = 2\n",
    b"[a]\n[a]\n", b"[a.b]\n[a]\n", b"[a]\n[a.b]\n", b"[a.b]\n[a]\n[a.b]\n",
    b"a.b = 1\n[a]\n", b"a.b = 1\n[a.b]\n", b"a.b = 1\n[a.c]\n",
    b"[fruit]\napple.color = 'red'\napple.taste.sweet = true\n[fruit.apple.texture]\nsmooth = true\n",
    b"[fruit]\napple.color = 'red'\n[fruit.apple]\n",
    b"[fruit]\napple.taste.sweet = true\n[fruit.apple.taste]\n",
    b"[a.b]\n[x]\n[a]\nb.c = 1\n", b"[a]\nb.c = 1\n[a.b]\n",
    b"[ a . \"b c\" . 'd' ]\nx = 1\n", b"[a]b = 1\n", b"[a] # c\nb = 1 # c\n",
    b"s = \"a\\tb\\\"c\\\\d\\ne\\rf\\bg\\fh\"\n", b"s = \"\\u00e9\\U0001F600\"\n",
    b"s = \"\\e\"\n", b"s = \"\\x41\"\n", b"s = \"\\uD800\"\n", b"s = \"\\U00110000\"\n",
    b"s = \"\\u0000\"\n", b"s = 'a\\b'\n", b"s = 'a\tb'\n", b"s = \"a\tb\"\n",
    b"s = \"a\x7fb\"\n", b"# \x7f\n", b"# \x01\n", b"# \t ok\n",
    b"s = \"\"\"x\"\"\"\n", b"s = '''x'''\n", b"t = {a = 1}\n", b"[[t]]\n",
    b"a = [[1]]\n", b"a = [1, [2]]\n", b"a = []\n", b"a = [ ]\n", b"a = [,]\n",
    b"a = [1,]\n", b"a = [1,,]\n", b"a = [\n1,\n# c\n2\n,]\n", b"a = [1, 'x', 2.5, true]\n",
    b"a = 1\r\nb = 2\r\n", b"a = 1\rb = 2\n", b"a = 1\r", b"a = [1,\r\n2]\r\n",
    b"\xef\xbb\xbfa = 1\n", b"a = \"\xc3\xa9\"\n", b"a = \"\xc3\"\n", b"a = \"\xed\xa0\x80\"\n",
    b"\xc3\xa9 = 1\n", b"\"\xc3\xa9\" = 1\n", b"a = true\nb = false\n", b"a = truee\n",
    b"a = tru\n", b"true = 1\n", b"1 = 1\n", b"1.2 = 3\n", b"-a_b = 1\n",
    b"a = 1979-05-27\n", b"a = 07:32:00\n", b"a = 1979-05-27T07:32:00Z\n",
    b"a = 1 2\n", b"a = \"x\" \"y\"\n", b"a =\n", b"a\n", b"[a\n", b"[]\n", b"[a.]\n",
    b"a = 1 # comment\n# c\n\n\n", b"", b"\n\n", b"   \t\n",
]

SNIPPETS = [b" = ", b"=", b"\"", b"'", b"[", b"]", b"[[", b".", b"\n", b"\r\n", b"1", b"0",
            b"_", b"e", b"E", b"+", b"-", b"inf", b"nan", b"true", b"false", b"#", b",",
            b"\\u00e9", b"\\", b"\\n", b"\\U0001F600", b"a", b"b.c", b"\t", b" ", b"{", b"}",
            b"\xc3\xa9", b"1979-05-27", b":", b"0x", b"1e5", b".5", b"\x00", b"\x7f"]


def mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        at = rng.randint(0, len(data))
        if op == 0:
            data[at:at] = rng.choice(SNIPPETS)
        elif op == 1 and data:
            del data[at:at + rng.randint(1, 4)]
        elif op == 2 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif op == 3 and data:
            start = rng.randrange(len(data))
            data[at:at] = data[start:start + rng.randint(1, 16)]
        elif op == 4:
            data[at:at + 1] = rng.choice(SNIPPETS)
        else:
            data = data[:at]
    return bytes(data)


def canon(v):
    """tomllib's value in toml_dump's typed form; None where outside our subset."""
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            c = canon(x)
            if c is None:
                return None
            out[k] = c
        return out
    if isinstance(v, list):
        if any(isinstance(x, (list, dict)) for x in v):
            return None
        out = [canon(x) for x in v]
        return None if any(x is None for x in out) else out
    if isinstance(v, bool):
        return ["b", v]
    if isinstance(v, int):
        # TOML: an integer that does not fit in 64 bits must be an error.
        return ["i", str(v)] if -2**63 <= v < 2**63 else None
    if isinstance(v, float):
        return ["f", v]
    if isinstance(v, str):
        return None if "\x00" in v else ["s", v]
    if isinstance(v, (datetime.date, datetime.time)):
        return None
    raise TypeError(type(v))


def same(ours, theirs):
    if isinstance(theirs, dict):
        return (isinstance(ours, dict) and list(ours) == list(theirs)
                and all(same(ours[k], theirs[k]) for k in theirs))
    if isinstance(theirs, list) and theirs and theirs[0] == "f":
        if not (isinstance(ours, list) and ours[0] == "f"):
            return False
        a, b = float(ours[1]), theirs[1]
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(theirs, list) and theirs and theirs[0] in ("s", "i", "b"):
        return ours == theirs
    return (isinstance(ours, list) and len(ours) == len(theirs)
            and all(same(a, b) for a, b in zip(ours, theirs)))


def main():
    dump, corpus = sys.argv[1], sys.argv[2]
    iterations = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
    seeds = list(EDGE_CASES)
    if os.path.isdir(corpus):
        for name in sorted(os.listdir(corpus)):
            with open(os.path.join(corpus, name), "rb") as f:
                seeds.append(f.read())
    rng = random.Random(20261130)
    cases = seeds + [mutate(rng, rng.choice(seeds)) for _ in range(iterations)]

    stdin = b"".join(b"%d\n%s" % (len(c), c) for c in cases)
    out = subprocess.run([dump], input=stdin, stdout=subprocess.PIPE, check=True).stdout
    lines = out.decode("utf-8", "surrogateescape").split("\n")[:-1]
    assert len(lines) == len(cases), (len(lines), len(cases))

    bad = 0
    counts = {"agree-accept": 0, "agree-reject": 0, "outside-subset": 0}
    for case, line in zip(cases, lines):
        ours_ok = line.startswith("OK ")
        try:
            text = case.decode("utf-8")
            if text.startswith("\ufeff"):
                text = text[1:]
            theirs = tomllib.loads(text)
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            theirs = "reject"
        problem = None
        if theirs == "reject":
            if ours_ok:
                problem = "accepted a document tomllib rejects"
            else:
                counts["agree-reject"] += 1
        else:
            c = canon(theirs)
            if c is None:
                # Outside the subset: must be refused (dates: any message).
                if ours_ok:
                    problem = "accepted a document outside the subset"
                else:
                    counts["outside-subset"] += 1
            elif not ours_ok:
                # Refused on purpose: features outside the subset, and floats
                # that overflow binary64 (tomllib makes them inf).
                if "not supported" in line or "float is out of range" in line:
                    counts["outside-subset"] += 1
                else:
                    problem = "rejected a document tomllib accepts"
            elif not same(json.loads(line[3:]), c):
                problem = "values differ from tomllib's: %s" % c
            else:
                counts["agree-accept"] += 1
        if problem:
            bad += 1
            if bad <= 10:
                print("DISAGREE: %s\n  input: %r\n  ours:  %s" % (problem, case, line[:300]))
    print("toml_diff: %d documents; %s; %d disagreements" % (len(cases), counts, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
