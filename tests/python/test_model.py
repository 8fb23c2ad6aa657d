"""AutoModelForCausalLM: loading, generate() with GenerationConfig's arguments, the forward pass,
streamers, config, errors, the console script. Numerical agreement with Transformers is in
test_parity.py; here the binding's conversions and contracts are checked."""

import json
import re
import threading

import numpy as np
import pytest

import tformers
from conftest import KJV, MODELS, REPO, run, tformers_command
from tformers import GenerationConfig, TextIteratorStreamer, TextStreamer

GREEDY = dict(do_sample=False, max_new_tokens=12)


def test_version_is_the_projects():
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert tformers.__version__ == re.search(r"project\(tformers VERSION ([0-9.]+)", cmake).group(1)


def test_the_installed_metadata_needs_numpy_and_offers_torch():
    # As pyproject.toml declares them: numpy required, torch only with the "torch" extra.
    from importlib.metadata import requires

    assert sorted(requires("tformers")) == sorted(["numpy>=2.0", 'torch>=2.4; extra == "torch"'])


def test_console_script_runs_the_cli(kjv_tokenizer):
    r = run([tformers_command(), "--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"tformers {tformers.__version__}", r.stdout + r.stderr
    r = run([tformers_command(), "tokenize", "-m", str(KJV), "And the LORD said"])
    assert r.returncode == 0, r.stderr
    ids = kjv_tokenizer.encode("And the LORD said")
    assert r.stdout.splitlines()[0] == "ids: " + ",".join(map(str, ids))
    assert run([tformers_command(), "generate", "--model"]).returncode == 2


def test_generate_returns_the_inputs_followed_by_new_tokens(kjv_model, kjv_tokenizer):
    inputs = kjv_tokenizer("And the LORD said", return_tensors="np")
    out = kjv_model.generate(**inputs, **GREEDY)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.shape == (1, 4 + 12)
    assert (out[:, :4] == inputs["input_ids"]).all()
    # A plain list and a GenerationConfig give the same greedy ids.
    same = kjv_model.generate([kjv_tokenizer.encode("And the LORD said")], generation_config=GenerationConfig(**GREEDY))
    assert (same == out).all()


def test_cache_and_compile_settings_do_not_change_greedy_ids(kjv_model, kjv_tokenizer):
    inputs = kjv_tokenizer("And the LORD said", return_tensors="np")
    plain = kjv_model.generate(**inputs, **GREEDY)
    for extra in (dict(cache_implementation="static"), dict(disable_compile=True), dict(max_cache_len=64)):
        assert (kjv_model.generate(**inputs, **GREEDY, **extra) == plain).all(), extra
    with pytest.raises(ValueError, match="cache_implementation"):
        kjv_model.generate(**inputs, **GREEDY, cache_implementation="offloaded")


def test_the_first_new_token_is_the_forward_passs_argmax(kjv_model, kjv_tokenizer):
    ids = kjv_tokenizer("And the LORD said unto", return_tensors="np")["input_ids"]
    logits = kjv_model(ids).logits
    assert logits.shape == (1, ids.shape[1], 4096) and logits.dtype == np.float32
    out = kjv_model.generate(ids, do_sample=False, max_new_tokens=1)
    assert out[0, -1] == logits[0, -1].argmax()


def test_float16_is_near_float32_and_auto_is_the_checkpoints_dtype(kjv_model, kjv_tokenizer):
    ids = kjv_tokenizer("And the LORD said unto", return_tensors="np")["input_ids"]
    want = kjv_model(ids).logits
    half = tformers.AutoModelForCausalLM.from_pretrained(KJV, dtype="float16")
    got = half(ids).logits
    assert got.dtype == np.float32
    # f16 weights, float32 math: f16's 11 significant bits (tests/models/test_golden.cc).
    assert np.abs(got - want).max() / np.abs(want).max() < 2.5e-3
    assert not np.array_equal(got, want)
    auto = tformers.AutoModelForCausalLM.from_pretrained(KJV, dtype="auto")
    assert auto.dtype == kjv_model.dtype  # config.json's torch_dtype, float32
    torch = pytest.importorskip("torch")
    assert tformers.AutoModelForCausalLM.from_pretrained(KJV, dtype=torch.float16).dtype == torch.float16


def test_a_left_padded_batch_gives_each_row_what_it_gets_alone(kjv_model, kjv_tokenizer):
    texts = ["And", "And the LORD said unto Moses"]
    batch = kjv_tokenizer(texts, padding=True, padding_side="left", return_tensors="np")
    out = kjv_model.generate(**batch, **GREEDY)
    for i, text in enumerate(texts):
        alone = kjv_model.generate(**kjv_tokenizer(text, return_tensors="np"), **GREEDY)
        assert out[i, -12:].tolist() == alone[0, -12:].tolist()
        assert (out[i, : batch["input_ids"].shape[1]] == batch["input_ids"][i]).all()


def test_right_padding_is_refused_with_the_fix(kjv_model, kjv_tokenizer):
    batch = kjv_tokenizer(["And", "And the LORD said"], padding=True, padding_side="right", return_tensors="np")
    with pytest.raises(ValueError, match='padding_side = "left"'):
        kjv_model.generate(**batch, **GREEDY)


def test_sampling_with_a_seed_repeats_and_beams_run(kjv_model, kjv_tokenizer):
    inputs = kjv_tokenizer("Blessed are", return_tensors="np")
    a = kjv_model.generate(**inputs, do_sample=True, seed=7, max_new_tokens=16)
    b = kjv_model.generate(**inputs, do_sample=True, seed=7, max_new_tokens=16)
    assert (a == b).all()
    beams = kjv_model.generate(**inputs, do_sample=False, num_beams=4, num_return_sequences=2, max_new_tokens=8)
    n = inputs["input_ids"].shape[1]
    assert beams.shape[0] == 2 and (beams[:, :n] == inputs["input_ids"]).all()


def test_an_assistant_model_keeps_greedy_ids_and_must_be_a_tformers_model(kjv_model, kjv_tokenizer):
    from tformers import AutoModelForCausalLM

    inputs = kjv_tokenizer("And the LORD said", return_tensors="np")
    assistant = AutoModelForCausalLM.from_pretrained(KJV, dtype="float32")
    plain = kjv_model.generate(**inputs, do_sample=False, max_new_tokens=24)
    assisted = kjv_model.generate(**inputs, do_sample=False, max_new_tokens=24, assistant_model=assistant,
                                  num_assistant_tokens=4)
    assert (plain == assisted).all()
    sampled = kjv_model.generate(**inputs, do_sample=True, seed=3, max_new_tokens=8, assistant_model=assistant)
    assert sampled.shape == (1, inputs["input_ids"].shape[1] + 8)
    with pytest.raises(TypeError, match="assistant_model must be a tformers model"):
        kjv_model.generate(**inputs, assistant_model="a path")


def test_return_dict_in_generate_gives_sequences_and_per_step_scores(kjv_model, kjv_tokenizer):
    inputs = kjv_tokenizer(["And the LORD said", "Blessed"], padding=True, padding_side="left", return_tensors="np")
    plain = kjv_model.generate(**inputs, **GREEDY)
    out = kjv_model.generate(**inputs, **GREEDY, return_dict_in_generate=True)
    assert isinstance(out, tformers.GenerateDecoderOnlyOutput)
    assert (out.sequences == plain).all() and (out["sequences"] == plain).all() and (out[0] == plain).all()
    assert list(out.keys()) == ["sequences"] and out.scores is None and out.logits is None

    out = kjv_model.generate(**inputs, **GREEDY, return_dict_in_generate=True, output_scores=True, output_logits=True,
                             repetition_penalty=1.3)
    n, vocab = inputs["input_ids"].shape[1], len(kjv_tokenizer)
    assert list(out.keys()) == ["sequences", "scores", "logits"]
    assert len(out.scores) == len(out.logits) == out.sequences.shape[1] - n
    eos = {4093, 4095}  # generation_config.json's eos_token_id
    for t, (scores, logits) in enumerate(zip(out.scores, out.logits)):
        assert scores.shape == logits.shape == (2, vocab) and scores.dtype == np.float32
        for b in range(2):
            if eos & set(out.sequences[b, n:n + t].tolist()):
                continue  # a finished row, whose token is padding whatever its scores
            assert scores[b].argmax() == out.sequences[b, n + t]  # greedy takes the best score
            # Transformers' repetition penalty over the row so far (prompt without its padding,
            # then the new tokens), where nothing else applies.
            real = np.concatenate([inputs["attention_mask"][b], np.ones(t, dtype=np.int64)]) == 1
            seen = np.zeros(vocab, dtype=bool)
            seen[out.sequences[b, :n + t][real]] = True
            penalized = np.where(logits[b] > 0, logits[b] / np.float32(1.3), logits[b] * np.float32(1.3))
            np.testing.assert_allclose(scores[b], np.where(seen, penalized, logits[b]), rtol=1e-6)
    # The first step's logits are the forward pass's at the prompt's last position.
    first = kjv_model(inputs["input_ids"][:1]).logits[0, -1]
    np.testing.assert_allclose(out.logits[0][0], first, atol=1e-4)


def test_return_dict_in_generate_with_beam_search(kjv_model, kjv_tokenizer):
    inputs = kjv_tokenizer("Blessed are", return_tensors="np")
    beams = dict(do_sample=False, num_beams=3, num_return_sequences=2, max_new_tokens=6)
    plain = kjv_model.generate(**inputs, **beams)
    out = kjv_model.generate(**inputs, **beams, return_dict_in_generate=True)
    assert isinstance(out, tformers.GenerateBeamDecoderOnlyOutput)
    assert (out.sequences == plain).all() and out.sequences_scores is None and out.scores is None

    out = kjv_model.generate(**inputs, **beams, return_dict_in_generate=True, output_scores=True, output_logits=True)
    assert (out.sequences == plain).all()
    assert out.sequences_scores.shape == (2,) and out.sequences_scores[0] >= out.sequences_scores[1]
    assert 1 <= len(out.scores) == len(out.logits) <= 6
    for scores, logits in zip(out.scores, out.logits):
        assert scores.shape == (3, len(kjv_tokenizer))  # one row per beam
        # No processor applies: the scores are log_softmax of the logits.
        top = logits.max(-1, keepdims=True)
        want = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        np.testing.assert_allclose(scores, want, atol=1e-5)


def test_torch_inputs_give_torch_outputs(kjv_model, kjv_tokenizer):
    torch = pytest.importorskip("torch")
    inputs = kjv_tokenizer("And the LORD said", return_tensors="pt")
    out = kjv_model.generate(**inputs, **GREEDY)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int64
    assert isinstance(kjv_model(inputs["input_ids"]).logits, torch.Tensor)
    full = kjv_model.generate(**inputs, **GREEDY, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(full.sequences, out)
    assert all(isinstance(s, torch.Tensor) and s.dtype == torch.float32 for s in full.scores)
    m = tformers.AutoModelForCausalLM.from_pretrained(KJV, dtype=torch.bfloat16)
    assert m.dtype == torch.bfloat16


def test_text_streamer_prints_what_decode_gives(kjv_model, kjv_tokenizer, capsys):
    inputs = kjv_tokenizer("And the LORD said", return_tensors="np")
    out = kjv_model.generate(**inputs, streamer=TextStreamer(kjv_tokenizer), **GREEDY)
    assert capsys.readouterr().out == kjv_tokenizer.decode(out[0]) + "\n"
    kjv_model.generate(**inputs, streamer=TextStreamer(kjv_tokenizer, skip_prompt=True), **GREEDY)
    assert capsys.readouterr().out == kjv_tokenizer.decode(out[0, 4:]) + "\n"


def test_text_iterator_streamer_from_another_thread(kjv_model, kjv_tokenizer):
    inputs = kjv_tokenizer("And the LORD said", return_tensors="np")
    streamer = TextIteratorStreamer(kjv_tokenizer, skip_prompt=True, timeout=60)
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=kjv_model.generate(**inputs, streamer=streamer, **GREEDY)))
    thread.start()
    text = "".join(streamer)
    thread.join()
    assert text == kjv_tokenizer.decode(result["out"][0, 4:])


def test_a_streamer_with_beam_search_is_refused(kjv_model, kjv_tokenizer):
    with pytest.raises(ValueError, match="beam search"):
        kjv_model.generate([[319, 259]], streamer=TextStreamer(kjv_tokenizer), do_sample=False, num_beams=2,
                           max_new_tokens=4)


def test_a_streamer_that_raises_stops_generate_with_its_exception(kjv_model, kjv_tokenizer):
    class Fails(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            if not stream_end and text:
                raise RuntimeError("streamer says stop")

    with pytest.raises(RuntimeError, match="streamer says stop"):
        kjv_model.generate(**kjv_tokenizer("And", return_tensors="np"), streamer=Fails(kjv_tokenizer), **GREEDY)


def test_a_streamer_calling_its_own_model_is_an_error_not_a_deadlock(kjv_model, kjv_tokenizer):
    class Reenters(TextStreamer):
        def on_finalized_text(self, text, stream_end=False):
            if not stream_end:
                kjv_model.generate([[319]], max_new_tokens=1)

    with pytest.raises(RuntimeError, match="its own streamer"):
        kjv_model.generate([[319, 259]], streamer=Reenters(kjv_tokenizer), **GREEDY)


def test_config_is_config_json_and_read_only(kjv_model):
    fields = json.loads((KJV / "config.json").read_text())
    assert kjv_model.config.hidden_size == fields["hidden_size"] == 256
    assert kjv_model.config.architectures == ["Qwen3ForCausalLM"] and kjv_model.config.model_type == "qwen3"
    assert kjv_model.config.to_dict()["num_hidden_layers"] == fields["num_hidden_layers"]
    with pytest.raises(AttributeError, match="read-only"):
        kjv_model.config.hidden_size = 8
    assert kjv_model.device == "cpu" or tformers.accelerator.is_available()


def test_accelerator_and_distributed_queries():
    assert isinstance(tformers.accelerator.is_available(), bool)
    assert tformers.accelerator.device_count() >= 0
    assert (tformers.accelerator.current_accelerator() is None) == (not tformers.accelerator.is_available())
    assert tformers.distributed.world_size() == 1 and tformers.distributed.is_main_process()
    assert "Qwen3ForCausalLM" in tformers.supported_architectures()


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(max_new_tokens="ten"), ValueError, "max_new_tokens"),
        (dict(temperature=-1.0, do_sample=True), ValueError, "temperature"),
        (dict(num_beams=0), ValueError, "num_beams"),
        (dict(early_stopping="sometimes"), ValueError, "early_stopping"),
        (dict(max_new_tokens=object()), TypeError, "object"),
        (dict(max_new_token=5), ValueError, "'max_new_token' is not a generation setting"),
    ],
)
def test_bad_generation_arguments_raise_naming_the_field(kjv_model, kwargs, exc, message):
    with pytest.raises(exc, match=message):
        kjv_model.generate([[319, 259]], **kwargs)


def test_bad_inputs_raise_clearly(kjv_model):
    with pytest.raises(ValueError, match="input_ids"):
        kjv_model.generate()
    with pytest.raises(ValueError, match="shape"):
        kjv_model.generate(np.zeros((1, 2, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="integer"):
        kjv_model.generate(np.zeros((1, 2)), max_new_tokens=1)
    with pytest.raises(ValueError, match="all zeros"):
        kjv_model.generate(np.ones((1, 2), dtype=np.int64), attention_mask=np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="vocab|range|4096"):
        kjv_model.generate([[99999]], max_new_tokens=1)
    with pytest.raises(ValueError):
        kjv_model(np.zeros((1, 0), dtype=np.int64))


def test_load_errors_are_transformers_exceptions(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        tformers.AutoModelForCausalLM.from_pretrained("/nonexistent/no-such-model")
    with pytest.raises(ValueError, match="bfloat16"):
        tformers.AutoModelForCausalLM.from_pretrained(KJV, dtype="float7")
    with pytest.raises(ValueError, match="attn_implementation"):
        tformers.AutoModelForCausalLM.from_pretrained(KJV, attn_implementation="flash_attention_2")
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(ValueError, match="config.json"):
        tformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("config.json", "generation_config.json"):
        (bad / f).write_text((MODELS / "tiny-qwen3" / f).read_text())
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises((ValueError, FileNotFoundError), match="model.safetensors|tensor"):
        tformers.AutoModelForCausalLM.from_pretrained(bad)
    with pytest.raises(ValueError, match="tp_size|world"):
        tformers.AutoModelForCausalLM.from_pretrained(KJV, distributed_config=tformers.DistributedConfig(tp_size=3))
