#!/usr/bin/env python3
"""Hostile clients against a running `tformers serve`, for the measurements in docs/serving.md.

  slowloris N SECONDS   N sockets send a request head a byte a second for SECONDS while a normal
                        client times a completion every second
  unauth N              N sockets each send a 16,000-byte head without an API key and never end
                        it; prints the server's RSS before and after (give --pid)

Only the standard library; loopback only. Example:
  tformers serve -m models/kjv-fortunes-tiny --port 8080 &
  python3 tests/serve/hostile_clients.py --port 8080 --pid $! slowloris 1000 30
"""

import argparse
import json
import socket
import time
import urllib.request


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def open_sockets(port, n, first_bytes):
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(first_bytes)
        socks.append(s)
    return socks


def timed_completion(port, model):
    body = json.dumps({"model": model, "prompt": "And the LORD said", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError as e:
        status = f"failed ({e})"
    return status, time.monotonic() - start


def slowloris(args):
    status, took = timed_completion(args.port, args.model)
    print(f"alone: status {status} in {took * 1000:.1f} ms")
    socks = open_sockets(args.port, args.n, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    if args.pid:
        print(f"server RSS with {args.n} slow sockets: {rss_kib(args.pid)} KiB")
    end = time.monotonic() + args.seconds
    worst = 0.0
    while time.monotonic() < end:
        for s in socks:
            try:
                s.send(b"X")
            except OSError:
                pass
        status, took = timed_completion(args.port, args.model)
        worst = max(worst, took)
        print(f"with {args.n} slow sockets: status {status} in {took * 1000:.1f} ms")
        time.sleep(1)
    print(f"worst: {worst * 1000:.1f} ms")


def unauth(args):
    before = rss_kib(args.pid)
    head = b"POST /v1/completions HTTP/1.1\r\n"
    line = b"x-filler: " + b"f" * 90 + b"\r\n"
    while len(head) + len(line) < 16000:
        head += line
    socks = open_sockets(args.port, args.n, head)
    time.sleep(3)
    after = rss_kib(args.pid)
    print(f"server RSS: {before} KiB before, {after} KiB with {len(socks)} unauthenticated "
          f"connections: {(after - before) / len(socks):.1f} KiB each")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--pid", type=int, default=0, help="the server's process id, for its RSS")
    p.add_argument("--model", default="models/kjv-fortunes-tiny")
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("slowloris")
    s.add_argument("n", type=int)
    s.add_argument("seconds", type=float)
    u = sub.add_parser("unauth")
    u.add_argument("n", type=int)
    args = p.parse_args()
    slowloris(args) if args.what == "slowloris" else unauth(args)


if __name__ == "__main__":
    main()
