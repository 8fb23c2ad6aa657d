// What llama.cpp computes on a GGUF written by safetensors_to_gguf.py, to check the conversion
// against Transformers or tformers on the same checkpoint: greedy decoding from a prompt of token
// ids, and at every step the log-probabilities of the whole vocabulary (llama.cpp's softmax of its
// logits, through node-llama-cpp's prebuilt CPU build; the logits themselves are those up to a
// constant per step). Prints one JSON object: {"ids": [...], "logprobs": [[...], ...]}, one row
// of logprobs per generated token, the row before that token was chosen.
//
//   node tools/peer/llama_cpp_logits.mjs MODEL.gguf --prompt-ids 1,17,300,45 [--max-new-tokens 16]
//                                         [--threads 1] [--no-logprobs]
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
};
const prompt = (opt("--prompt-ids", "") || "").split(",").filter((s) => s !== "").map(Number);
if (args.length < 1 || args[0].startsWith("--") || prompt.length === 0) {
  console.error("usage: llama_cpp_logits.mjs MODEL.gguf --prompt-ids 1,17,300,45 " +
                "[--max-new-tokens 16] [--threads 1] [--no-logprobs]");
  process.exit(2);
}
const steps = Number(opt("--max-new-tokens", "16"));
const threads = Number(opt("--threads", "1"));
const logprobs = !args.includes("--no-logprobs");

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: args[0] });
const context = await model.createContext({
  contextSize: Math.max(256, prompt.length + steps), threads: { ideal: threads, min: threads },
  // f32 K and V (llama.cpp's default is f16, which rounds them to 11 bits) and no flash
  // attention (its CPU kernel computes in f16: 1e-3 of the logits' scale on gpt-oss's tiny
  // checkpoints, against 1e-6 without), so that what is left comes from the weights.
  experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", flashAttention: false,
});
const seq = context.getSequence();
const nVocab = model.tokens.count ?? model.fileInsights.tokens?.count;
// Greedy: temperature 0 is llama.cpp's greedy sampler, which leaves every candidate's logit as it
// is, so the probabilities are the softmax of the raw logits over the whole vocabulary.
const next = { generateNext: { token: true, probabilities: logprobs, options: { temperature: 0 } } };
const out = { ids: [], logprobs: [] };
let input = prompt.map((t, i) => (i === prompt.length - 1 ? [t, next] : t));
for (let s = 0; s < steps; ++s) {
  const res = await seq.controlledEvaluate(input);
  const n = res[res.length - 1].next;
  out.ids.push(n.token);
  if (logprobs) {
    const row = new Array(nVocab).fill(-Infinity);
    for (const [tok, p] of n.probabilities) row[tok] = Math.log(p);
    out.logprobs.push(row);
  }
  input = [[n.token, next]];
}
console.log(JSON.stringify(out, (_, v) => (v === -Infinity ? null : v)));
await context.dispose();
await model.dispose();
await llama.dispose();
