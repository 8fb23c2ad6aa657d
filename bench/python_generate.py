"""generate() through the Python package against the same call through C++, in one run.

    python bench/python_generate.py [--model DIR] [--new-tokens 64] [--rounds 15]
        [--cpp build/release/bench/bench_generate]

Both sides load the model in float32 and run the same greedy generate() of exactly
--new-tokens tokens after the same prompt; the C++ side is bench_generate, asked for one call
at a time, so the two alternate call by call (and swap which goes first every round) and share
the machine's state alike. Prints each side's median seconds and the Python/C++ ratio, and
checks that both produced the same ids. Run it with the interpreter of a virtual environment
where the package is installed.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = [319, 259, 378, 417]  # "And the LORD said" in the shipped model's tokenizer


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "kjv-fortunes-tiny"))
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cpp", default=str(REPO / "build" / "release" / "bench" / "bench_generate"))
    args = p.parse_args()

    from tformers import AutoModelForCausalLM

    n = args.new_tokens
    cpp = subprocess.Popen([args.cpp, args.model, str(n), ",".join(map(str, PROMPT))],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if cpp.stdout.readline().strip() != "ready":
        print("bench_generate did not start", file=sys.stderr)
        return 1
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="float32", device_map="cpu")
    settings = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n)
    model.generate([PROMPT], **settings)  # warm-up, as the C++ side did

    def run_cpp():
        cpp.stdin.write("go\n")
        cpp.stdin.flush()
        secs, *ids = cpp.stdout.readline().split()
        return float(secs), [int(i) for i in ids]

    def run_py():
        start = time.perf_counter()
        out = model.generate([PROMPT], **settings)
        return time.perf_counter() - start, out[0, len(PROMPT):].tolist()

    times = {"C++": [], "Python": []}
    ids = {}
    for r in range(args.rounds):
        order = [("C++", run_cpp), ("Python", run_py)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            secs, ids[name] = fn()
            times[name].append(secs)
    cpp.stdin.close()
    cpp.wait()
    if ids["C++"] != ids["Python"]:
        print("the two sides generated different ids", file=sys.stderr)
        return 1
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"generate() of {n} tokens, {args.rounds} rounds alternated, medians:")
    for k, v in med.items():
        print(f"  {k:7s} {v * 1000:8.2f} ms  ({n / v:7.1f} tokens/s; min {min(times[k]) * 1000:.2f} ms)")
    print(f"  Python / C++: {med['Python'] / med['C++']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
