// The `tformers` command: generate, chat, tokenize, env.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>

#include <unistd.h>

#include "core/cpu_features.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "distributed/launcher.h"
#include "io/hub.h"
#include "kernels_hub/cli.h"
#include "tformers/accelerator.h"
#include "tformers/distributed.h"
#include "tformers/error.h"
#include "tformers/model.h"
#include "tformers/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      throw tformers::InvalidArgumentError("--prompt-ids: '" + item +
                                           "' is not a token id (use comma-separated integers, "
                                           "e.g. 785,8585,49041)");
    ids.push_back(int32_t(v));
  }
  return ids;
}

// The tokenizer of a model folder, or nothing when it ships none.
std::optional<tformers::Tokenizer> maybe_tokenizer(const std::string& model) {
  std::string dir = tformers::io::resolve_model_path(model);
  if (!std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) return std::nullopt;
  return tformers::AutoTokenizer::from_pretrained(dir);
}

int cmd_env() {
  std::printf("tformers %s\n", TFORMERS_VERSION);
  std::printf("cpu features: %s\n", std::string(tformers::cpu::feature_string()).c_str());
  for (const std::string& line : tformers::accelerator::describe_backends())
    std::printf("backend %s\n", line.c_str());
  std::printf("accelerator available: %s\n", tformers::accelerator::is_available() ? "yes" : "no");
  std::string archs;
  for (const auto& a : tformers::supported_architectures())
    archs += (archs.empty() ? "" : ", ") + a;
  std::printf("architectures: %s\n", archs.c_str());
  return 0;
}

struct GenerateArgs {
  std::string model, prompt, prompt_ids, system, dtype, device = "auto", quantize;
  bool chat = false, verbose = false, do_sample = false;
  int64_t tp = 0;  // tensor-parallel processes (under tformers launch); 0: the whole model here
  std::string tp_plan;  // JSON object for DistributedConfig.tp_plan; "": the default plan
  std::optional<int64_t> max_new_tokens, top_k, seed, no_repeat_ngram_size;
  std::optional<double> temperature, top_p, min_p, typical_p, repetition_penalty;
};

tformers::GenerationConfig generation_config(const GenerateArgs& a) {
  tformers::GenerationConfig gc;
  gc.max_new_tokens = a.max_new_tokens;
  if (a.do_sample) gc.do_sample = true;
  gc.temperature = a.temperature;
  gc.top_k = a.top_k;
  gc.top_p = a.top_p;
  gc.min_p = a.min_p;
  gc.typical_p = a.typical_p;
  gc.repetition_penalty = a.repetition_penalty;
  gc.no_repeat_ngram_size = a.no_repeat_ngram_size;
  if (a.seed) gc.seed = uint64_t(*a.seed);
  return gc;
}

// --tp-plan's JSON object {"module pattern": "style"}, as DistributedConfig.tp_plan takes it.
std::map<std::string, std::string> parse_tp_plan(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw tformers::InvalidArgumentError("--tp-plan: not valid JSON: " + std::string(e.what()));
  }
  if (!j.is_object())
    throw tformers::InvalidArgumentError(
        "--tp-plan must be a JSON object {\"module pattern\": \"style\", ...}, got " + j.dump());
  std::map<std::string, std::string> plan;
  for (const auto& [key, style] : j.items()) {
    if (!style.is_string())
      throw tformers::InvalidArgumentError("--tp-plan: the style of \"" + key +
                                           "\" must be a string, got " + style.dump());
    plan[key] = style.get<std::string>();
  }
  return plan;
}

// Loads the model, with a progress bar on a terminal when that takes more than half a second.
tformers::CausalLM load_model(const GenerateArgs& a) {
  tformers::LoadOptions opt;
  opt.device_map = a.device;
  opt.verbose = a.verbose;
  opt.quantize = a.quantize;
  if (!a.dtype.empty()) opt.dtype = tformers::parse_dtype(a.dtype);
  if (a.tp > 0 || !a.tp_plan.empty()) {
    tformers::DistributedConfig dc;
    if (a.tp > 0) dc.tp_size = a.tp;
    if (!a.tp_plan.empty()) dc.tp_plan = parse_tp_plan(a.tp_plan);
    opt.distributed_config = dc;
  }
  tformers::ProgressBar bar(stderr,
                            isatty(fileno(stderr)) && tformers::distributed::is_main_process());
  opt.progress = [&bar](std::string_view stage, int64_t done, int64_t total) {
    bar.update(stage, done, total);
  };
  return tformers::AutoModelForCausalLM::from_pretrained(a.model, opt);
}

int cmd_generate(const GenerateArgs& a) {
  if (a.prompt.empty() == a.prompt_ids.empty())
    throw tformers::InvalidArgumentError("generate: give exactly one of --prompt and --prompt-ids");
  // Under tformers launch every rank runs the same generation; rank 0 alone prints.
  if (!tformers::distributed::is_main_process()) std::freopen("/dev/null", "w", stdout);
  auto t0 = Clock::now();
  std::optional<tformers::Tokenizer> tok = maybe_tokenizer(a.model);
  std::vector<int32_t> ids;
  if (!a.prompt_ids.empty()) {
    ids = parse_ids(a.prompt_ids);
  } else {
    if (!tok)
      throw tformers::NotFoundError("generate: " + a.model +
                                    " has no tokenizer.json, so --prompt cannot be encoded; use "
                                    "--prompt-ids");
    std::string text = a.prompt;
    if (a.chat) {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
      messages.push_back({{"role", "user"}, {"content", a.prompt}});
      text = tok->apply_chat_template(messages, /*add_generation_prompt=*/true);
    }
    // A rendered chat template already holds its special tokens.
    ids = tok->encode(text, /*add_special_tokens=*/!a.chat);
  }
  tformers::CausalLM lm = load_model(a);
  auto t1 = Clock::now();

  tformers::GenerationConfig gc = generation_config(a);
  // Split ranks must sample alike: rank 0's seed everywhere.
  if (a.tp > 0 && !gc.seed) gc.seed = tformers::distributed::agree_seed(std::random_device{}());

  // Stream text as it becomes final (never half a UTF-8 character), or ids without a tokenizer.
  std::optional<tformers::TokenStreamer> streamer;
  if (tok) streamer.emplace(*tok, /*skip_special_tokens=*/true);
  if (tok && !a.chat && !a.prompt.empty()) std::fputs(a.prompt.c_str(), stdout);
  bool first = true;
  Clock::time_point first_token;
  auto out = lm.generate(
      {ids}, gc,
      [&](int64_t, int32_t id) {
        if (first) first_token = Clock::now();
        if (streamer) {
          std::fputs(streamer->put(id).c_str(), stdout);
        } else {
          std::printf(first ? "%d" : ",%d", id);
        }
        first = false;
        std::fflush(stdout);
        return true;
      },
      tok ? &*tok : nullptr);
  if (streamer) std::fputs(streamer->end().c_str(), stdout);
  std::printf("\n");
  auto t2 = Clock::now();
  if (a.verbose) {
    auto secs = [](Clock::time_point x, Clock::time_point y) {
      return std::chrono::duration<double>(y - x).count();
    };
    size_t n = out[0].size() - ids.size();
    auto st = lm.compile_stats();
    std::fprintf(stderr,
                 "tformers: load %.3f s; prompt %zu tokens, time to first token %.3f s; %zu "
                 "tokens at %.1f tokens/s after the first; compiles %llu, cache hits %llu\n",
                 secs(t0, t1), ids.size(), secs(t1, first_token), n,
                 n > 1 ? double(n - 1) / secs(first_token, t2) : 0.0,
                 (unsigned long long)st.compiles, (unsigned long long)st.hits);
  }
  return 0;
}

// An interactive multi-turn chat: each turn renders the whole conversation through the chat
// template and streams the reply. Commands: /reset clears the history, /exit (or end of input)
// quits.
int cmd_chat(const GenerateArgs& a) {
  tformers::Tokenizer tok = tformers::AutoTokenizer::from_pretrained(a.model);
  if (tok.chat_template().empty())
    throw tformers::InvalidArgumentError("chat: " + a.model +
                                         " has no chat_template in tokenizer_config.json; use "
                                         "`tformers generate` for plain text");
  tformers::CausalLM lm = load_model(a);
  const tformers::GenerationConfig gc = generation_config(a);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  auto reset = [&] {
    messages = nlohmann::ordered_json::array();
    if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  };
  reset();
  std::string line;
  for (;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      reset();
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    std::vector<int32_t> ids =
        tok.encode(tok.apply_chat_template(messages, /*add_generation_prompt=*/true), false);
    tformers::TokenStreamer streamer(tok, /*skip_special_tokens=*/true);
    std::string reply;
    lm.generate(
        {ids}, gc,
        [&](int64_t, int32_t id) {
          std::string piece = streamer.put(id);
          reply += piece;
          std::fputs(piece.c_str(), stdout);
          std::fflush(stdout);
          return true;
        },
        &tok);
    std::string rest = streamer.end();
    reply += rest;
    std::printf("%s\n", rest.c_str());
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  std::printf("\n");
  return 0;
}

int cmd_tokenize(const std::string& model, const std::string& text, bool special) {
  tformers::Tokenizer tok = tformers::AutoTokenizer::from_pretrained(model);
  std::vector<int32_t> ids = tok.encode(text, special);
  std::vector<std::string> pieces = tok.convert_ids_to_tokens(ids);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? "," : "") + std::to_string(ids[i]);
  std::printf("ids: %s\n", line.c_str());
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%8d  %s\n", ids[i], pieces[i].c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `launch` takes a command after `--`, so it parses its own arguments.
  if (argc > 1 && tformers::distributed::is_launcher_command(argv[1]))
    return tformers::distributed::launcher_main(argc - 1, argv + 1);
  CLI::App app{"tformers: run Hugging Face causal language models natively"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads, "CPU threads (default: TFORMERS_NUM_THREADS or all cores)");

  CLI::App* env =
      app.add_subcommand("env", "Print the version, CPU features, backends and accelerators");

  app.add_subcommand("launch", tformers::distributed::kLaunchHelp)->allow_extras();

  GenerateArgs g;
  CLI::App* gen = app.add_subcommand("generate", "Generate text from a prompt");
  CLI::App* chat = app.add_subcommand("chat", "Chat with a model, turn by turn, in the terminal");
  for (CLI::App* sub : {gen, chat}) {
    sub->add_option("--model,-m", g.model, "Model folder or Hub id in the local cache")->required();
    sub->add_option("--system", g.system, "System message");
    sub->add_option("--max-new-tokens,-n", g.max_new_tokens, "Tokens to generate");
    sub->add_flag("--do-sample", g.do_sample, "Sample instead of greedy decoding");
    sub->add_option("--temperature", g.temperature);
    sub->add_option("--top-k", g.top_k);
    sub->add_option("--top-p", g.top_p);
    sub->add_option("--min-p", g.min_p);
    sub->add_option("--typical-p", g.typical_p);
    sub->add_option("--repetition-penalty", g.repetition_penalty);
    sub->add_option("--no-repeat-ngram-size", g.no_repeat_ngram_size);
    sub->add_option("--seed", g.seed, "Sampling seed (same seed, same text)");
    sub->add_option("--dtype", g.dtype,
                    "float32 or bfloat16 (default: the checkpoint's torch_dtype)");
    sub->add_option("--device", g.device, "cpu, auto, tpu or cuda")->capture_default_str();
    sub->add_option("--quantize", g.quantize,
                    "int8: weight-only int8 linears, one scale per 32 weights (as Q8_0)");
    sub->add_flag("--verbose,-v", g.verbose,
                  "Show compiles, cache hits, time to first token, tokens/s");
  }
  gen->add_option("--prompt,-p", g.prompt, "Prompt text (needs the model's tokenizer.json)");
  gen->add_option("--prompt-ids", g.prompt_ids, "Prompt token ids, comma-separated");
  gen->add_flag("--chat", g.chat, "Wrap the prompt in the model's chat template");
  gen->add_option("--tp", g.tp, "Split the model over N processes (run under tformers launch)");
  gen->add_option("--tp-plan", g.tp_plan,
                  "Tensor-parallel overrides as a JSON object, e.g. "
                  "'{\"layers.*.self_attn.q_proj\": \"replicated_with_grad_allreduce\"}'");

  std::string tok_model, tok_text;
  bool tok_special = false;
  CLI::App* tokz = app.add_subcommand("tokenize", "Show the token ids and pieces of a text");
  tokz->add_option("--model,-m", tok_model, "Model folder or Hub id in the local cache")
      ->required();
  tokz->add_option("text", tok_text, "Text to tokenize")->required();
  tokz->add_flag("--add-special-tokens", tok_special, "Add the post-processor's special tokens");

  CLI::App* kernels = app.add_subcommand("kernels", "Hub kernels: list | lock | verify (--help)");
  kernels->prefix_command()->set_help_flag();  // its own usage: tformers kernels --help

  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) tformers::ThreadPool::set_global_threads(threads);
    if (env->parsed()) return cmd_env();
    if (kernels->parsed()) return tformers::kernels_hub::kernels_cli(kernels->remaining());
    if (gen->parsed()) return cmd_generate(g);
    if (chat->parsed()) return cmd_chat(g);
    if (tokz->parsed()) return cmd_tokenize(tok_model, tok_text, tok_special);
  } catch (const tformers::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return tformers::distributed::fail(1);  // under mpirun: end every rank, none waits for this one
  }
  return 0;
}
