# The guide's tensor-parallel inference: run with `tformers launch --nproc-per-node 2 -- python
# tensor_parallel.py`; every rank holds half of each layer and rank 0 prints.
from tformers import AutoModelForCausalLM, AutoTokenizer, DistributedConfig, distributed

model_id = "models/kjv-fortunes-tiny"
tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModelForCausalLM.from_pretrained(
    model_id, dtype="float32", device_map="auto", distributed_config=DistributedConfig(tp_size=2)
)

inputs = tokenizer("And the LORD said", return_tensors="np").to(model.device)
output = model.generate(**inputs, do_sample=False, max_new_tokens=20, cache_implementation="static")
if distributed.is_main_process():
    print(tokenizer.decode(output[0], skip_special_tokens=True))
