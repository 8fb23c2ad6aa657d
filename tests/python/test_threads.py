"""The GIL is released while the engine runs: two threads generate on two models at once, each
getting what it gets alone, and a Python thread keeps running during generate()."""

import threading
import time

import numpy as np

from conftest import KJV, MODELS

PROMPT = [[3, 141, 59, 265, 358, 97]]
SETTINGS = dict(do_sample=False, max_new_tokens=48)


def test_two_threads_generate_on_two_models():
    from tformers import AutoModelForCausalLM

    models = [AutoModelForCausalLM.from_pretrained(MODELS / name, dtype="float32") for name in ("tiny-llama", "tiny-qwen3")]
    alone = [m.generate(PROMPT, **SETTINGS) for m in models]
    results = [None, None]
    errors = []

    def work(i):
        try:
            for _ in range(3):
                results[i] = models[i].generate(PROMPT, **SETTINGS)
                assert (results[i] == alone[i]).all()
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all((r == a).all() for r, a in zip(results, alone))


def test_threads_sharing_one_model_take_turns():
    from tformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODELS / "tiny-qwen3", dtype="float32")
    prompts = [PROMPT, [[7, 8, 9]], [[400, 3]]]
    alone = [model.generate(p, **SETTINGS) for p in prompts]
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: model.generate(prompts[i], **SETTINGS)}))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all((results[i] == alone[i]).all() for i in range(3))


def test_python_runs_during_generate():
    from tformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(KJV, dtype="float32")
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    model.generate([[319, 259, 378, 417]], do_sample=False, max_new_tokens=8)  # compile first
    t = threading.Thread(target=ticker)
    start = time.monotonic()
    t.start()
    out = model.generate([[319, 259, 378, 417]], do_sample=False, max_new_tokens=200, min_new_tokens=200)
    end = time.monotonic()
    stop.set()
    t.join()
    assert out.shape[1] == 204
    during = [x for x in ticks if start < x < end]
    # With the GIL held for the whole call the ticker would not run in between at all.
    assert len(during) >= 10, (len(during), end - start)
    assert np.diff(during).max() < 0.5 * (end - start)
