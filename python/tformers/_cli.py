"""The `tformers` console script: runs the command shipped in the package (bin/tformers, the same
executable as build/release/tformers) in this process's place, so signals, exit status and
terminal handling are the command's own."""

import os
import sys


def main() -> None:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tformers")
    os.execv(exe, ["tformers", *sys.argv[1:]])
