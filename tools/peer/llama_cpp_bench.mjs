// llama.cpp (through node-llama-cpp's prebuilt CPU binaries, pinned in package.json) on a GGUF
// written by safetensors_to_gguf.py from a benchmark checkpoint (bench_model's, or make_shape's
// for bench/peer_llama_cpp.sh --shape gpt-oss-20b-2l): decode tokens/s, time to first token of a
// 128-token prompt and prefill of --prefill tokens (0 = skip), for the same numbers of threads as
// tformers' side, and the model load. Prints one JSON line per thread count; bench/RESULTS.md
// ("Peer") puts them beside tformers' in the same run.
//
//   node tools/peer/llama_cpp_bench.mjs MODEL.gguf [--threads 1,2] [--decode 32] [--prefill 512]
//                                       [--load-mode mmap|none]
//
// --load-mode is llama.cpp's use_mmap. mmap (llama.cpp's default) runs on the file's mapping, as
// tformers' --load-mode mmap does: the load maps the file and the pages arrive as the first
// evaluation touches them, so load_s leaves most of the reading to the TTFT runs. none reads every
// weight into memory of its own before the load returns, as tformers' default (copy, which
// bench_model times) does.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

// The package's version, from its package.json (its "exports" do not expose the file).
const entry = createRequire(import.meta.url).resolve("node-llama-cpp");
const version = JSON.parse(readFileSync(join(dirname(entry), "..", "package.json"))).version;

const args = process.argv.slice(2);
if (args.length < 1 || args[0].startsWith("--")) {
  console.error("usage: llama_cpp_bench.mjs MODEL.gguf [--threads 1,2] [--decode 32] " +
                "[--prefill 512] [--load-mode mmap|none]");
  process.exit(2);
}
const modelPath = args[0];
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
};
const threadCounts = opt("--threads", "1,2").split(",").map(Number);
const decodeSteps = Number(opt("--decode", "32"));
const prefillTokens = Number(opt("--prefill", "512"));
const loadMode = opt("--load-mode", "mmap");
if (loadMode !== "mmap" && loadMode !== "none") {
  console.error(`llama_cpp_bench.mjs: --load-mode ${loadMode}: use mmap or none`);
  process.exit(2);
}

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
// Token ids below 1000: any ids do for random weights; the same for every run.
const ids = (n, seed) => Array.from({ length: n }, (_, i) => (seed * 7919 + i * 104729) % 1000);
const now = () => Number(process.hrtime.bigint()) / 1e9;

// "never": use the prebuilt binaries or fail, never compile or download anything.
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const t0 = now();
const model = await llama.loadModel({ modelPath, useMmap: loadMode === "mmap" });
const loadSeconds = now() - t0;
// What llama.cpp did, which is the request unless this system cannot map files.
const loadUsed = model.useMmap ? "mmap" : "none";

for (const threads of threadCounts) {
  const context = await model.createContext({
    contextSize: Math.max(1024, prefillTokens), batchSize: 512,
    threads: { ideal: threads, min: threads }, sequences: 1,
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
  for (let r = 0; prefillTokens > 0 && r < 2; ++r)
    await run(async (seq) => {
      const t = now();
      await seq.evaluateWithoutGeneratingNewTokens(ids(prefillTokens, 10 + r));
      prefills.push(now() - t);
    });
  console.log(JSON.stringify({
    engine: `llama.cpp (node-llama-cpp ${version})`, load_mode: loadUsed, load_s: loadSeconds,
    threads, decode_tok_s: 1 / median(steps), decode_steps: steps.length, ttft128_ms: 1e3 * median(ttfts),
    ...(prefillTokens > 0 && { [`prefill${prefillTokens}_tok_s`]: prefillTokens / median(prefills) }),
  }));
  await context.dispose();
}
await model.dispose();
await llama.dispose();
