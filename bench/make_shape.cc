// Writes a benchmark shape's checkpoint with random bf16 weights (bench/model_shapes.h), for
// `tformers bench` and the peers to load: scripts/device_check.sh makes its models with it.
//   build/release/bench/make_shape SHAPE DIR
// SHAPE is qwen3-0.6b, llama-3.2-1b, llama-3.1-8b, qwen3-30b-a3b-2l, gpt-oss-20b-2l,
// gpt-oss-20b, qwen3.5-9b-4l, qwen3-8b-4l or gemma-4-e4b-12l; DIR gets config.json and
// model.safetensors, unless it already holds them.
#include <cstdio>
#include <exception>
#include <string>

#include "bench_help.h"
#include "model_shapes.h"

namespace {

const char* kUsage =
    "usage: make_shape SHAPE DIR\n"
    "  Writes SHAPE (qwen3-0.6b, llama-3.2-1b, llama-3.1-8b, qwen3-30b-a3b-2l: two of\n"
    "  Qwen3-30B-A3B's layers, gpt-oss-20b-2l: two of gpt-oss-20b's, its experts MXFP4, or\n"
    "  gpt-oss-20b: all 24, qwen3.5-9b-4l: four of Qwen3.5-9B's (three Gated DeltaNet, one\n"
    "  attention), qwen3-8b-4l: four of Qwen3-8B's, gemma-4-e4b-12l: twelve of\n"
    "  Gemma-4-E4B's text layers, six of them KV-shared)\n"
    "  with random bf16 weights into\n"
    "  DIR as config.json and model.safetensors; a DIR that holds them is left as it is.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace tformers;
  if (bench::answered_help(argc, argv, kUsage)) return 0;
  if (argc != 3) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const bench::ModelShape* shape = bench::find_shape(argv[1]);
  if (!shape) {
    std::fprintf(stderr, "make_shape: unknown shape '%s'\n%s", argv[1], kUsage);
    return 2;
  }
  try {
    bench::make_model(*shape, argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_shape: %s\n", e.what());
    return 1;
  }
  return 0;
}
