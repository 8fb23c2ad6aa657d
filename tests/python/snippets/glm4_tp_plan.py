# The guide's GLM-4 example: 2 KV heads cannot be split over 4 ranks, so tp_plan replicates the
# attention projections and splits the MLPs. Run with `tformers launch --nproc-per-node 4`.
# tiny-glm4 has no tokenizer, so the prompt is ids; rank 0 prints the new ids and whether a
# whole (unsplit) copy of the model generates the same.
import sys

from tformers import AutoModelForCausalLM, DistributedConfig, distributed

model_id = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(
    model_id,
    dtype="float32",
    distributed_config=DistributedConfig(
        tp_size=4,
        tp_plan={
            "layers.*.self_attn.q_proj": "replicated_with_grad_allreduce",
            "layers.*.self_attn.k_proj": "replicated_with_grad_allreduce",
            "layers.*.self_attn.v_proj": "replicated_with_grad_allreduce",
            "layers.*.self_attn.o_proj": "replicated_with_grad_allreduce",
        },
    ),
)
whole = AutoModelForCausalLM.from_pretrained(model_id, dtype="float32")
prompt = [[3, 141, 59, 265, 358, 97, 93, 238, 46, 264, 338, 327]]
output = model.generate(prompt, max_new_tokens=16, do_sample=False)
expected = whole.generate(prompt, max_new_tokens=16, do_sample=False)
if distributed.is_main_process():
    print("ranks", distributed.world_size(), "same", (output == expected).all(), output[0, 12:].tolist())
