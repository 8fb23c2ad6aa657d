"""Ctrl-C during generate() raises KeyboardInterrupt at the next token (the next step of a beam
search), not at the end."""

import signal
import subprocess
import sys
import time

import pytest

from conftest import KJV, REPO

# The child sets Python's Ctrl-C handler itself: a suite started in the background by a shell
# without job control (`nohup scripts/test.sh &`) hands its processes SIGINT ignored, and Python
# then leaves it ignored, so the signal below would do nothing.
SCRIPT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from tformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({kjv!r}, dtype="float32")
model.generate([[319]], do_sample=False, max_new_tokens=2)
print("generating", flush=True)
start = time.monotonic()
try:
    # Long enough that finishing would take far longer than the test waits.
    for _ in range(1000):
        model.generate([[319, 259]], max_new_tokens=250, min_new_tokens=250, {settings})
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(0)
print("finished", flush=True)
"""


@pytest.mark.parametrize("settings", ["do_sample=True", "do_sample=False, num_beams=4"], ids=["sampling", "beams"])
def test_ctrl_c_raises_keyboard_interrupt_promptly(settings):
    script = SCRIPT.format(kjv=str(KJV), settings=settings)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO)
    assert p.stdout.readline() == "generating\n", p.stderr.read()
    time.sleep(0.5)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    waited = time.monotonic() - sent
    assert p.returncode == 0 and out == "interrupted\n", out + err
    assert waited < 2.0, waited
