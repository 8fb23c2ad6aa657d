"""tformers: Hugging Face causal LMs on a native C++ engine, with Transformers' API.

    from tformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("models/kjv-fortunes-tiny")
    model = AutoModelForCausalLM.from_pretrained("models/kjv-fortunes-tiny", dtype="bfloat16")
    inputs = tokenizer("And the LORD said", return_tensors="np")
    output = model.generate(**inputs, max_new_tokens=40, cache_implementation="static")
    print(tokenizer.decode(output[0], skip_special_tokens=True))

docs/python.md has the whole API and how it differs from Transformers'.
"""

from . import accelerator, distributed
from ._core import __version__, supported_architectures
from .distributed import DistributedConfig
from .generation import BaseStreamer, GenerationConfig, TextIteratorStreamer, TextStreamer
from .kernels import KernelConfig, kernelize
from .modeling import AutoModelForCausalLM, CausalLM, PretrainedConfig
from .modeling_outputs import CausalLMOutput, GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput, ModelOutput
from .tokenization import AutoTokenizer, BatchEncoding, PreTrainedTokenizerFast

__all__ = [
    "AutoModelForCausalLM", "AutoTokenizer", "BaseStreamer", "BatchEncoding", "CausalLM", "CausalLMOutput",
    "DistributedConfig", "GenerateBeamDecoderOnlyOutput", "GenerateDecoderOnlyOutput", "GenerationConfig",
    "KernelConfig", "ModelOutput", "PreTrainedTokenizerFast", "PretrainedConfig", "TextIteratorStreamer",
    "TextStreamer", "__version__", "accelerator", "distributed", "kernelize", "supported_architectures",
]
