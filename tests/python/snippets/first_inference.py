# The Transformers TPU guide's first inference, word for word but for the import and a local
# model folder (the guide's device_map="tpu" is "auto" here: the best device this machine has).
from tformers import AutoModelForCausalLM, AutoTokenizer

model_id = "models/kjv-fortunes-tiny"
tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModelForCausalLM.from_pretrained(model_id, dtype="bfloat16", device_map="auto")

inputs = tokenizer("And the LORD said", return_tensors="pt").to(model.device)
output = model.generate(**inputs, do_sample=True, max_new_tokens=50, cache_implementation="static")
print(tokenizer.decode(output[0], skip_special_tokens=True))
