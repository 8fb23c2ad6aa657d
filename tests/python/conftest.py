"""Shared paths for the Python package's tests. The package under test is the installed one (a
fresh virtual environment in scripts/test.sh), never python/ on sys.path."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KJV = REPO / "models" / "kjv-fortunes-tiny"
MODELS = REPO / "tests" / "data" / "models"
SNIPPETS = Path(__file__).resolve().parent / "snippets"


def tformers_command() -> str:
    """The console script installed beside this interpreter."""
    exe = Path(sys.executable).parent / "tformers"
    return str(exe) if exe.exists() else shutil.which("tformers")


def run(cmd, timeout=300, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, **kw.pop("env", {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, **kw)


@pytest.fixture(scope="session")
def kjv_tokenizer():
    from tformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(KJV)


@pytest.fixture(scope="session")
def kjv_model():
    from tformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(KJV, dtype="float32")


needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found (Debian: openmpi-bin)")
