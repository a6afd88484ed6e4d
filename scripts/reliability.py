#!/usr/bin/env python3
"""Replay the HTTP edge's hard cases against a running int4serve.

    scripts/reliability.py --url http://127.0.0.1:8000
    scripts/reliability.py --url http://10.0.0.5:8000 --api-key KEY --header-timeout 20

Each case prints PASS, FAIL (with what was seen) or SKIP; the exit status is 1
when any case failed. The cases: framing a proxy could read otherwise (two
Content-Lengths, Content-Length with chunks, no Host, bad header names),
error bodies in OpenAI's form, a body's Content-Type (415), the Host values
served (DNS rebinding; on a loopback address), no CORS headers for an origin
not listed, a 413 that Python's http.client reads after sending its whole
body, connections that trickle their headers (closed at the header
deadline, while other clients are served), 256 connections from one
address, a 2 MB prompt while other connections are probed, GET
/v1/models/{id}, and X-Request-Id. Only the Python standard library.

Options that must match the server's configuration: --header-timeout
(server.header_timeout), --body-limit (limits.body_limit). --quick leaves
out the cases that take longer than the header deadline.
"""
import argparse
import http.client
import json
import socket
import sys
import threading
import time
import urllib.parse

RESULTS = []


def report(name, ok, detail=""):
    state = "PASS" if ok is True else ("SKIP" if ok is None else "FAIL")
    RESULTS.append(state)
    print(f"{state} {name}" + (f": {detail}" if detail else ""), flush=True)


class Target:
    def __init__(self, url, api_key):
        u = urllib.parse.urlparse(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.hostport = f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"
        self.api_key = api_key
        self.loopback = self.host in ("localhost", "::1") or self.host.startswith("127.")

    def auth(self):
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def raw(self, data, timeout=5.0):
        """Send bytes on a fresh connection; read until the server closes."""
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            s.sendall(data)
            out = b""
            while True:
                try:
                    b = s.recv(65536)
                except socket.timeout:
                    break
                if not b:
                    break
                out += b
            return out
        finally:
            s.close()

    def request(self, method, path, body=None, headers=None, timeout=30.0):
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = dict(self.auth())
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def parse_raw(out):
    """(status, headers dict, body bytes) of a raw HTTP/1.x answer."""
    if not out.startswith(b"HTTP/1."):
        return None, {}, out
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def openai_error(headers, body):
    """The error object when body is OpenAI's error body, else None."""
    if "application/json" not in headers.get("content-type", ""):
        return None
    try:
        j = json.loads(body)
        e = j["error"]
        if set(e) >= {"message", "type", "param", "code"} and len(j) == 1:
            return e
    except (ValueError, KeyError, TypeError):
        pass
    return None


def case_framing(t):
    h = f"Host: {t.hostport}\r\n"
    auth = "".join(f"{k}: {v}\r\n" for k, v in t.auth().items())
    ct = "Content-Type: application/json\r\n"
    body = '{"prompt":[1],"max_tokens":1}'
    cases = {
        "two Content-Length values": f"POST /v1/completions HTTP/1.1\r\n{h}{auth}{ct}Content-Length: {len(body)}\r\nContent-Length: 3\r\n\r\n{body}",
        "Content-Length and chunked": f"POST /v1/completions HTTP/1.1\r\n{h}{auth}{ct}Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding gzip": f"POST /v1/completions HTTP/1.1\r\n{h}{auth}{ct}Transfer-Encoding: gzip\r\n\r\n",
        "HTTP/1.1 without Host": "GET /health HTTP/1.1\r\n\r\n",
        "two Host headers": f"GET /health HTTP/1.1\r\n{h}Host: other\r\n\r\n",
        "blank before a colon": f"POST /v1/completions HTTP/1.1\r\n{h}{auth}{ct}Content-Length : {len(body)}\r\n\r\n{body}",
    }
    for name, req in cases.items():
        st, hd, b = parse_raw(t.raw(req.encode()))
        e = openai_error(hd, b)
        report(f"framing: {name}", st == 400 and e is not None and hd.get("connection") == "close",
               f"status {st}, body {b[:120]!r}")


def case_errors(t):
    for method, path, body, want in [("GET", "/no/such/route", None, 404),
                                     ("GET", "/v1/completions", None, 405),
                                     ("POST", "/v1/completions", b"{not json", 400)]:
        st, hd, b = t.request(method, path, body=body,
                              headers={"Content-Type": "application/json"} if body else {})
        report(f"error body: {method} {path} -> {want}",
               st == want and openai_error(hd, b) is not None, f"status {st}, body {b[:120]!r}")


def served_model(t):
    st, _, b = t.request("GET", "/v1/models")
    return json.loads(b)["data"][0]["id"] if st == 200 else None


def case_content_type(t, model):
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 1})
    for ct in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]:
        st, hd, b = t.request("POST", "/v1/completions", body=body, headers={"Content-Type": ct})
        report(f"Content-Type {ct} -> 415", st == 415 and openai_error(hd, b) is not None,
               f"status {st}")
    st, _, b = t.request("POST", "/v1/completions", body=body,
                         headers={"Content-Type": "application/json; charset=utf-8"})
    report("Content-Type application/json; charset=utf-8 -> 200", st == 200, f"status {st}")


def case_hosts_and_cors(t):
    if not t.loopback:
        report("Host attacker.example -> 400", None, "the server is not on a loopback address")
    else:
        st, hd, b = parse_raw(t.raw(b"GET /health HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"))
        report("Host attacker.example -> 400 (DNS rebinding)",
               st == 400 and openai_error(hd, b) is not None, f"status {st}")
    st, hd, _ = t.request("GET", "/v1/models", headers={"Origin": "https://attacker.example"})
    report("no CORS headers for an origin not listed",
           st == 200 and not any(k.startswith("access-control-") for k in hd), f"headers {hd}")


def case_413(t, body_limit):
    """http.client sends the whole body, then reads: it must read the 413."""
    body = b" " * (body_limit + (1 << 20))
    try:
        st, hd, b = t.request("POST", "/v1/completions", body=body,
                              headers={"Content-Type": "application/json"})
        report(f"413 read by http.client after a {len(body) >> 20} MiB body",
               st == 413 and openai_error(hd, b) is not None, f"status {st}")
    except OSError as e:
        report(f"413 read by http.client after a {len(body) >> 20} MiB body", False,
               f"{type(e).__name__}: {e}")


def probe_health(t, stop, lat):
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            st, _, _ = t.request("GET", "/health", timeout=10)
            lat.append(time.monotonic() - t0 if st == 200 else float("inf"))
        except OSError:
            lat.append(float("inf"))
        time.sleep(0.01)


def case_slow_headers(t, header_timeout, n):
    """n connections send their head a byte a second: each is closed within
    the header deadline of its first byte; other clients are served."""
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {t.hostport}\r\nX-Pad: ".encode() + b"a" * 1000
    socks = []
    for _ in range(n):
        s = socket.create_connection((t.host, t.port), timeout=5)
        s.setblocking(False)
        s.send(head[:1])
        socks.append([s, time.monotonic(), None])
    stop, lat = threading.Event(), []
    th = threading.Thread(target=probe_health, args=(t, stop, lat))
    th.start()
    i, deadline = 1, time.monotonic() + header_timeout + 3
    while time.monotonic() < deadline and any(c[2] is None for c in socks):
        time.sleep(1.0)
        for c in socks:
            if c[2] is not None:
                continue
            try:
                if c[0].recv(1) == b"":
                    c[2] = time.monotonic()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                c[2] = time.monotonic()
                continue
            try:
                c[0].send(head[i:i + 1])
            except OSError:
                c[2] = time.monotonic()
        i += 1
    stop.set()
    th.join()
    for c in socks:
        c[0].close()
    held = [c[2] - c[1] for c in socks if c[2] is not None]
    open_left = sum(1 for c in socks if c[2] is None)
    worst = max(lat) if lat else float("inf")
    report(f"{n} connections trickling their headers closed within {header_timeout:g} s",
           open_left == 0 and max(held) < header_timeout + 2.5,
           f"{open_left} still open, longest held {max(held) if held else 0:.1f} s")
    report("probes answered while they trickle", worst < 1.0,
           f"{len(lat)} probes, slowest {worst * 1e3:.0f} ms")


def case_many_connections(t, n):
    socks = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection((t.host, t.port), timeout=10))
        req = f"GET /health HTTP/1.1\r\nHost: {t.hostport}\r\n\r\n".encode()
        for s in socks:
            s.sendall(req)
        ok = 0
        for s in socks:
            try:
                if s.recv(4096).startswith(b"HTTP/1.1 200"):
                    ok += 1
            except OSError:
                pass
        report(f"{n} connections at once from one address", ok == n, f"{ok} answered 200")
    finally:
        for s in socks:
            s.close()


def case_large_prompt(t, model, limit_ms):
    text = ("the quick brown fox jumps over the lazy dog " * 50000)[: 2 << 20]
    body = json.dumps({"model": model, "prompt": text, "max_tokens": 1})
    stop, lat = threading.Event(), []
    th = threading.Thread(target=probe_health, args=(t, stop, lat))
    th.start()
    time.sleep(0.05)
    statuses = []
    for _ in range(3):
        st, _, _ = t.request("POST", "/v1/completions", body=body,
                             headers={"Content-Type": "application/json"}, timeout=120)
        statuses.append(st)
    stop.set()
    th.join()
    worst = max(lat) if lat else float("inf")
    if 413 in statuses:
        report("probes during a 2 MB prompt", None, "the server's body_limit is below 2 MB")
        return
    report(f"probes during a 2 MB prompt within {limit_ms:g} ms", worst * 1e3 < limit_ms,
           f"{len(lat)} probes, slowest {worst * 1e3:.1f} ms; prompt answered {statuses}")


def case_models_and_ids(t, model):
    st, _, lb = t.request("GET", "/v1/models")
    item = json.loads(lb)["data"][0]
    st, hd, b = t.request("GET", "/v1/models/" + urllib.parse.quote(model, safe=""))
    report("GET /v1/models/{id}", st == 200 and json.loads(b) == item, f"status {st}")
    st, hd, b = t.request("GET", "/v1/models/no-such-model")
    e = openai_error(hd, b)
    report("GET /v1/models/{unknown} -> 404 model_not_found",
           st == 404 and e is not None and e["code"] == "model_not_found", f"status {st}")
    rid = "reliability-check-0001"
    st, hd, b = t.request("POST", "/v1/completions",
                          body=json.dumps({"model": model, "prompt": "hi", "max_tokens": 1}),
                          headers={"Content-Type": "application/json", "X-Request-Id": rid})
    ok = st == 200 and hd.get("x-request-id") == rid and json.loads(b)["id"] == "cmpl-" + rid
    report("X-Request-Id echoed and used as the completion id", ok,
           f"status {st}, header {hd.get('x-request-id')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--header-timeout", type=float, default=20.0,
                    help="the server's server.header_timeout (seconds)")
    ap.add_argument("--body-limit", type=int, default=2 << 20,
                    help="the server's limits.body_limit (bytes)")
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--slow", type=int, default=64, help="connections that trickle their headers")
    ap.add_argument("--probe-ms", type=float, default=50.0,
                    help="the slowest probe allowed while a 2 MB prompt is tokenized")
    ap.add_argument("--quick", action="store_true", help="leave out the slow-header case")
    a = ap.parse_args()
    t = Target(a.url, a.api_key)
    try:
        model = served_model(t)
    except OSError as e:
        print(f"cannot reach {a.url}: {e}")
        return 2
    if model is None:
        print(f"{a.url}/v1/models did not answer 200 (an API key needed? --api-key)")
        return 2
    case_framing(t)
    case_errors(t)
    case_content_type(t, model)
    case_hosts_and_cors(t)
    case_413(t, a.body_limit)
    case_many_connections(t, a.connections)
    case_large_prompt(t, model, a.probe_ms)
    case_models_and_ids(t, model)
    if a.quick:
        report("connections trickling their headers", None, "--quick")
    else:
        case_slow_headers(t, a.header_timeout, a.slow)
    failed = RESULTS.count("FAIL")
    print(f"{RESULTS.count('PASS')} passed, {failed} failed, {RESULTS.count('SKIP')} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
