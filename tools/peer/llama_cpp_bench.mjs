// llama.cpp (through node-llama-cpp's prebuilt CPU binaries, pinned in package.json) on a GGUF
// written by safetensors_to_gguf.py from bench_model's checkpoint: decode tokens/s, time to first
// token of a 128-token prompt and prefill of 512 tokens, for the same numbers of threads as
// bench/bench_model. Prints one JSON line per thread count; bench/RESULTS.md ("Peer") puts them
// beside tformers' in the same run.
//
//   node tools/peer/llama_cpp_bench.mjs MODEL.gguf [--threads 1,2] [--decode 32]
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

// The package's version, from its package.json (its "exports" do not expose the file).
const entry = createRequire(import.meta.url).resolve("node-llama-cpp");
const version = JSON.parse(readFileSync(join(dirname(entry), "..", "package.json"))).version;

const args = process.argv.slice(2);
if (args.length < 1 || args[0].startsWith("--")) {
  console.error("usage: llama_cpp_bench.mjs MODEL.gguf [--threads 1,2] [--decode 32]");
  process.exit(2);
}
const modelPath = args[0];
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
};
const threadCounts = opt("--threads", "1,2").split(",").map(Number);
const decodeSteps = Number(opt("--decode", "32"));

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
// Token ids below 1000: any ids do for random weights; the same for every run.
const ids = (n, seed) => Array.from({ length: n }, (_, i) => (seed * 7919 + i * 104729) % 1000);
const now = () => Number(process.hrtime.bigint()) / 1e9;

// "never": use the prebuilt binaries or fail, never compile or download anything.
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath, useMmap: true });

for (const threads of threadCounts) {
  const context = await model.createContext({
    contextSize: 1024, batchSize: 512, threads: { ideal: threads, min: threads }, sequences: 1,
  });
  const run = async (fn) => {
    const seq = context.getSequence();
    try { return await fn(seq); } finally { seq.dispose(); }
  };
  // Time to first token: the prompt's evaluation plus its first sampled token; then decode
  // steps, each one token through the whole model including the output layer.
  const ttfts = [], steps = [];
  for (let r = 0; r < 3; ++r)
    await run(async (seq) => {
      let t = now(), first = true;
      let n = 0;
      for await (const _ of seq.evaluate(ids(128, r), { temperature: 0 })) {
        const t2 = now();
        (first ? ttfts : steps).push(t2 - t);
        first = false;
        t = t2;
        if (++n > decodeSteps) break;
      }
    });
  const prefills = [];
  for (let r = 0; r < 2; ++r)
    await run(async (seq) => {
      const t = now();
      await seq.evaluateWithoutGeneratingNewTokens(ids(512, 10 + r));
      prefills.push(now() - t);
    });
  console.log(JSON.stringify({
    engine: `llama.cpp (node-llama-cpp ${version})`,
    threads, decode_tok_s: 1 / median(steps), decode_steps: steps.length, ttft128_ms: 1e3 * median(ttfts),
    prefill512_tok_s: 512 / median(prefills),
  }));
  await context.dispose();
}
await model.dispose();
await llama.dispose();
