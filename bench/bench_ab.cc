// Two builds of libtformers.so in one process, called alternately round by round, so that a
// kernel change is measured against the same drifting bandwidth (on a shared host, separate runs
// of one build differ by 10-30 %; two copies of one build compared here differ by a few %).
//
//   bench_ab OLD.so NEW.so attention [--threads N] [--rounds R] [--used L] [--queries T]
//                                    [--heads HQ] [--layers NL]
//       NL (28) layers of Qwen3-0.6B-shaped bf16 caches (8 KV heads of 128), each its own
//       buffer: T query tokens (1: decode) attending to L cache slots, HQ query heads. One layer
//       at a short used length (--layers 1 --used 1024: 4 MiB) stays in L3, which times the
//       arithmetic rather than memory.
//   bench_ab OLD.so NEW.so paged-attention [--threads N] [--rounds R] [--used L] [--streams B]
//                                          [--heads HQ] [--layers NL]
//       Decode over a paged KV pool, as the serving engine's steps: B (16) sequences of L (1024)
//       positions each, one query token each, in blocks of 16 positions placed at random in each
//       layer's pool of Qwen3-0.6B-shaped bf16 keys and values.
//   bench_ab OLD.so NEW.so linear-bf16|linear-int8|linear-int4 [--threads N] [--rounds R]
//                                                              [--lm-head 1] [--layers NL]
//                                                              [--rows M] [--prompt-rows 1]
//       The decode linears of NL (28) Qwen3-0.6B layers, each weight its own buffer, for M (1)
//       decode rows (a serving step of M streams); with --lm-head 1, Qwen3-0.6B's lm_head
//       (151936 x 1024) instead: many short rows. --prompt-rows 1 passes the M rows as prompt
//       rows (LinearRows::kAny: the GEMM from 4 rows), to time the two kernels on one library.
//   bench_ab OLD.so NEW.so decode|prefill --model DIR [--quantize int8|int4] [--threads N]
//                                           [--rounds R] [--tokens T]
//       A whole model through each build's public API (AutoModelForCausalLM, CausalLM::forward):
//       T (16) single-token decode steps after a 16-token prompt, or one T (64)-token forward,
//       per round. The checkpoint is read by both builds (bf16 weights, or quantized at load).
//
// Prints each build's median time and GB/s of cache or weights, the median of the per-round
// ratios old / new (> 1: the new build is faster), the largest difference between the builds'
// outputs of the last call (the last layer or weight), and a 4-stream read loop over the same
// buffers on one thread (the model modes print the times, the ratio and the logits' largest
// difference). Copy a build's library
// aside (cp build/release/libtformers.so /tmp/old/) before changing it. The builds are reached
// through their exported C++ symbols, so both must have the same signatures.
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_help.h"
#include "core/memory.h"
#include "core/stream_read.h"
#include "core/thread_pool.h"
#include "tformers/model.h"

namespace {

using AttentionFn = void (*)(const float*, const void*, const void*, uint8_t, const int32_t*,
                             float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                             float, void*);
using PagedAttentionFn = void (*)(const float*, const void*, const void*, uint8_t, const int32_t*,
                                  const int32_t*, float*, int64_t, int64_t, int64_t, int64_t,
                                  int64_t, int64_t, int64_t, float, int64_t, float, void*);
// The linears' last argument is cpu::LinearRows (an int-sized enum).
using LinearFn = void (*)(const float*, const void*, uint8_t, const void*, float*, int64_t, int64_t,
                          int64_t, void*, int);
using LinearInt8Fn = void (*)(const float*, const int8_t*, const float*, const float*, float*,
                              int64_t, int64_t, int64_t, void*, int);
using LinearInt4Fn = void (*)(const float*, const uint8_t*, const uint16_t*, const uint8_t*,
                              const float*, float*, int64_t, int64_t, int64_t, void*, int);
constexpr uint8_t kBf16 = 1;  // tformers::DType::bf16

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_ab: %s\n", what.c_str());
  std::exit(2);
}

// A build's exported symbols by mangled name: its own copy of each (RTLD_DEEPBIND: its calls
// resolve inside it first); a missing one ends the program naming it.
class Symbols {
 public:
  explicit Symbols(const char* path) : path_(path) {
    h_ = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h_) die(std::string("cannot load ") + path + ": " + dlerror());
  }
  void* operator()(const char* name) const {
    void* p = dlsym(h_, name);
    if (!p) die(path_ + " has no symbol " + name);
    return p;
  }

 private:
  std::string path_;
  void* h_ = nullptr;
};

// One build: its own copy of every symbol (RTLD_DEEPBIND: its calls resolve inside it first) and
// its own thread pool.
struct Build {
  AttentionFn attention;
  PagedAttentionFn paged_attention;
  LinearFn linear;
  LinearInt8Fn linear_int8;
  LinearInt4Fn linear_int4;
  alignas(tformers::ThreadPool) unsigned char pool[sizeof(tformers::ThreadPool)];

  Build(const char* path, int threads) {
    const Symbols sym(path);
    attention = reinterpret_cast<AttentionFn>(
        sym("_ZN8tformers3cpu9attentionEPKfPKvS4_NS_5DTypeEPKiPflllllllfRNS_10ThreadPoolE"));
    paged_attention = reinterpret_cast<PagedAttentionFn>(
        sym("_ZN8tformers3cpu15paged_attentionEPKfPKvS4_NS_5DTypeEPKiS7_PflllllllflfRNS_"
            "10ThreadPoolE"));
    linear = reinterpret_cast<LinearFn>(
        sym("_ZN8tformers3cpu6linearEPKfPKvNS_5DTypeES4_PflllRNS_10ThreadPoolENS0_10LinearRowsE"));
    linear_int8 = reinterpret_cast<LinearInt8Fn>(
        sym("_ZN8tformers3cpu11linear_int8EPKfPKaS2_S2_PflllRNS_10ThreadPoolENS0_"
            "10LinearRowsE"));
    linear_int4 = reinterpret_cast<LinearInt4Fn>(
        sym("_ZN8tformers3cpu11linear_int4EPKfPKhPKtS4_S2_PflllRNS_10ThreadPoolENS0_"
            "10LinearRowsE"));
    reinterpret_cast<void (*)(void*, int)>(sym("_ZN8tformers10ThreadPoolC1Ei"))(pool, threads);
  }
};

// One build's model: loaded, run and freed through that build's own exported functions.
class BuildModel {
 public:
  BuildModel(const char* path, const std::string& model, const std::string& quantize, int threads) {
    const Symbols sym(path);
    using SetThreads = void (*)(int);
    using Load = tformers::CausalLM (*)(const std::string&, const tformers::LoadOptions&);
    reinterpret_cast<SetThreads>(sym("_ZN8tformers10ThreadPool18set_global_threadsEi"))(threads);
    forward_ = reinterpret_cast<Forward>(sym("_ZN8tformers8CausalLM7forwardERKNS_11ForwardArgsE"));
    reset_ = reinterpret_cast<Reset>(sym("_ZN8tformers8CausalLM11reset_cacheEll"));
    // The member functions are called as functions taking `this` first (the Itanium ABI).
    lm_.emplace(reinterpret_cast<Load>(
        sym("_ZN8tformers20AutoModelForCausalLM15from_pretrainedERKNSt7__cxx1112basic_stringIcSt"
            "11char_traitsIcESaIcEEERKNS_11LoadOptionsE"))(
        model, {.dtype = tformers::bfloat16, .device_map = "cpu", .quantize = quantize}));
  }
  void reset_cache(int64_t batch, int64_t len) { reset_(&*lm_, batch, len); }
  tformers::Tensor forward(const tformers::ForwardArgs& a) { return forward_(&*lm_, a); }

 private:
  using Forward = tformers::Tensor (*)(tformers::CausalLM*, const tformers::ForwardArgs&);
  using Reset = void (*)(tformers::CausalLM*, int64_t, int64_t);
  Forward forward_ = nullptr;
  Reset reset_ = nullptr;
  std::optional<tformers::CausalLM> lm_;
};

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Times `old_side` then `new_side` once per round, rounds + 1 times (round 0 warms up: compiles,
// allocates) and keeps each build's times and the per-round ratios old / new.
struct Alternated {
  std::vector<double> old_s, new_s, ratio;
};
Alternated alternate(int rounds, const std::function<double()>& old_side,
                     const std::function<double()>& new_side) {
  Alternated t;
  for (int r = 0; r < rounds + 1; ++r) {
    const double t_old = old_side(), t_new = new_side();
    if (r == 0) continue;
    t.old_s.push_back(t_old);
    t.new_s.push_back(t_new);
    t.ratio.push_back(t_old / t_new);
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Distinct small finite bf16 values of both signs from a cheap hash.
void fill_bf16(uint16_t* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = (i + seed) * 0x9e3779b97f4a7c15ull;
    p[i] = uint16_t(0x3c00 | (h >> 40 & 0x1ff) | (h >> 20 & 0x8000));
  }
}

}  // namespace

const char* const kUsage =
    R"(usage: bench_ab OLD.so NEW.so attention [--threads N] [--rounds R] [--used L] [--queries T]
                                 [--heads HQ] [--layers NL]
       bench_ab OLD.so NEW.so paged-attention [--threads N] [--rounds R] [--used L]
                                 [--streams B] [--heads HQ] [--layers NL]
       bench_ab OLD.so NEW.so linear-bf16|linear-int8|linear-int4 [--threads N] [--rounds R]
                                 [--lm-head 1] [--layers NL] [--rows M] [--prompt-rows 1]
       bench_ab OLD.so NEW.so decode|prefill --model DIR [--quantize int8|int4] [--threads N]
                                 [--rounds R] [--tokens T]
Two builds of libtformers.so called alternately, round by round; prints each build's median
time and GB/s, and the median ratio old / new (> 1: the new build is faster).
)";

// decode|prefill: each round times the same forward passes through the old, then the new build.
int run_model_mode(int argc, char** argv) {
  const std::string mode = argv[3];
  std::string model, quantize;
  int threads = 1, rounds = 7;
  int64_t tokens = mode == "decode" ? 16 : 64;
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") {
      model = v;
    } else if (k == "--quantize") {
      quantize = v;
    } else if (k == "--threads" || k == "--rounds" || k == "--tokens") {
      const int64_t n = std::atoll(v.c_str());
      if (n <= 0) die("option " + k + " needs a positive number");
      if (k == "--threads") threads = int(n);
      if (k == "--rounds") rounds = int(n);
      if (k == "--tokens") tokens = n;
    } else {
      die("unknown option " + k);
    }
  }
  if ((argc - 4) % 2) die("options come in pairs: --name value");
  if (model.empty()) die(mode + " needs --model DIR");
  BuildModel a(argv[1], model, quantize, threads), b(argv[2], model, quantize, threads);
  constexpr int64_t kPrompt = 16;
  const int64_t cache_len = kPrompt + tokens + 1;
  auto ids = [](int64_t n) {
    tformers::Tensor t = tformers::Tensor::zeros({1, n}, tformers::DType::i32);
    for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = int32_t(100 + 37 * i);
    return t;
  };
  // One round: the prompt, then `tokens` decode steps (decode), or one forward of `tokens`.
  auto round = [&](BuildModel& m, tformers::Tensor& logits) {
    m.reset_cache(1, cache_len);
    tformers::ForwardArgs p{.input_ids = ids(mode == "decode" ? kPrompt : tokens)};
    if (mode == "prefill") return seconds([&] { logits = m.forward(p); });
    m.forward(p);
    tformers::ForwardArgs step{.input_ids = ids(1)};
    return seconds([&] {
      for (int64_t i = 0; i < tokens; ++i) {
        step.cache_position = kPrompt + i;
        logits = m.forward(step);
      }
    });
  };
  tformers::Tensor la, lb;
  const Alternated t = alternate(
      rounds, [&] { return round(a, la); }, [&] { return round(b, lb); });
  const std::vector<double>&ta = t.old_s, &tb = t.new_s, &ratio = t.ratio;
  double max_diff = 0;
  for (int64_t i = 0; i < la.numel(); ++i)
    max_diff = std::max(max_diff, double(std::fabs(la.data<float>()[i] - lb.data<float>()[i])));
  const double per = mode == "decode" ? double(tokens) : 1.0;
  std::printf(
      "%s %s, %d thread%s: old %.2f ms, new %.2f ms per %s (%.2f / %.2f tok/s); old/new median "
      "of %d rounds %.3f; max |old - new| logit %.2g\n",
      mode.c_str(), quantize.empty() ? "bf16" : quantize.c_str(), threads, threads > 1 ? "s" : "",
      median(ta) / per * 1e3, median(tb) / per * 1e3, mode == "decode" ? "token" : "forward",
      per / median(ta) * (mode == "decode" ? 1 : tokens),
      per / median(tb) * (mode == "decode" ? 1 : tokens), rounds, median(ratio), max_diff);
  return 0;
}

int main(int argc, char** argv) {
  if (tformers::bench::answered_help(argc, argv, kUsage)) return 0;
  if (argc >= 4 && (std::string(argv[3]) == "decode" || std::string(argv[3]) == "prefill"))
    return run_model_mode(argc, argv);
  if (argc < 4)
    die("usage: bench_ab OLD.so NEW.so attention|paged-attention|linear-bf16|linear-int8|"
        "linear-int4 [options]");
  const std::string mode = argv[3];
  int threads = 1, rounds = 11;
  int64_t used = 0, queries = 1, heads = 16, lm_head = 0, layers = 28, streams = 16, rows = 1,
          prompt_rows = 0;
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (v <= 0) die("option " + k + " needs a positive number");
    if (k == "--threads")
      threads = int(v);
    else if (k == "--rounds")
      rounds = int(v);
    else if (k == "--used")
      used = v;
    else if (k == "--queries")
      queries = v;
    else if (k == "--heads")
      heads = v;
    else if (k == "--lm-head")
      lm_head = v;
    else if (k == "--layers")
      layers = v;
    else if (k == "--streams")
      streams = v;
    else if (k == "--rows")
      rows = v;
    else if (k == "--prompt-rows")
      prompt_rows = v;
    else
      die("unknown option " + k);
  }
  if ((argc - 4) % 2) die("options come in pairs: --name value");
  Build a(argv[1], threads), b(argv[2], threads);

  constexpr int64_t kKvHeads = 8, kHeadDim = 128;
  // Per layer (attention) or per weight (linear), in the memory the model's weights and caches
  // get (allocate_pages: 2 MiB-aligned, huge pages asked for), not malloc's: where transparent huge
  // pages are "madvise", malloc'd buffers get 4 KiB pages, which read slower than a loaded model.
  struct Pages {
    std::shared_ptr<void> mem;
    size_t bytes;
    char* data() const { return static_cast<char*>(mem.get()); }
    size_t size() const { return bytes; }
  };
  std::vector<Pages> buffers;
  auto add_buffer = [&](size_t bytes) {
    buffers.push_back({tformers::allocate_pages(bytes), bytes});
    return buffers.back().data();
  };
  std::vector<std::function<void(Build&, float*)>> calls;
  size_t out_size = 0;
  std::vector<float> x;
  if (mode == "attention") {
    if (used == 0) used = 4096;
    if (queries > used || heads % kKvHeads) die("need queries <= used and heads a multiple of 8");
    const int64_t cache = kKvHeads * used * kHeadDim;  // one of K, V per layer
    x.resize(size_t(queries * heads * kHeadDim));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
    out_size = x.size();
    for (int64_t l = 0; l < layers; ++l) {
      uint16_t* kv = reinterpret_cast<uint16_t*>(add_buffer(size_t(2 * cache * 2)));
      fill_bf16(kv, size_t(2 * cache), uint64_t(l));
      calls.push_back([=, &x](Build& bd, float* out) {
        bd.attention(x.data(), kv, kv + cache, kBf16, nullptr, out, 1, queries, heads, kKvHeads,
                     used, kHeadDim, used - queries, 1.0f / std::sqrt(float(kHeadDim)), bd.pool);
      });
    }
  } else if (mode == "paged-attention") {
    if (heads % kKvHeads) die("need heads a multiple of 8");
    if (used == 0) used = 1024;
    constexpr int64_t kBlock = 16;
    const int64_t per_seq = (used + kBlock - 1) / kBlock, blocks = streams * per_seq;
    const int64_t block_elems = kKvHeads * kBlock * kHeadDim;  // one block of K or V
    x.resize(size_t(streams * heads * kHeadDim));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
    out_size = x.size();
    auto pos = std::make_shared<std::vector<int32_t>>(size_t(streams), int32_t(used - 1));
    std::mt19937_64 rng(1);
    for (int64_t l = 0; l < layers; ++l) {
      uint16_t* kv = reinterpret_cast<uint16_t*>(add_buffer(size_t(2 * blocks * block_elems * 2)));
      fill_bf16(kv, size_t(2 * blocks * block_elems), uint64_t(l));
      // Each layer's blocks in a shuffled order.
      auto table = std::make_shared<std::vector<int32_t>>(size_t(blocks));
      std::iota(table->begin(), table->end(), 0);
      std::shuffle(table->begin(), table->end(), rng);
      calls.push_back([=, &x](Build& bd, float* out) {
        bd.paged_attention(x.data(), kv, kv + blocks * block_elems, kBf16, table->data(),
                           pos->data(), out, streams, 1, heads, kKvHeads, kBlock, per_seq, kHeadDim,
                           1.0f / std::sqrt(float(kHeadDim)), 0, 0.0f, bd.pool);
      });
    }
  } else if (mode == "linear-bf16" || mode == "linear-int8" || mode == "linear-int4") {
    const bool int8 = mode == "linear-int8", int4 = mode == "linear-int4";
    // tformers::cpu::LinearRows: kAny (0) or kDecode (1).
    const int row_kind = prompt_rows ? 0 : 1;
    // q, k, v, o, gate, up, down of Qwen3-0.6B.
    std::vector<std::array<int64_t, 2>> shapes = {{2048, 1024}, {1024, 1024}, {1024, 1024},
                                                  {1024, 2048}, {3072, 1024}, {3072, 1024},
                                                  {1024, 3072}};
    if (lm_head) {
      shapes = {{151936, 1024}};
      layers = 1;
    }
    x.resize(size_t(rows * 3072));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
    out_size = size_t(rows * (lm_head ? 151936 : 3072));
    for (int64_t l = 0; l < layers; ++l)
      for (const auto& s : shapes) {
        const int64_t N = s[0], K = s[1], nb = (K + 31) / 32;
        if (int4) {  // tiles of random codes (kernels.h), scales as int8's
          const int64_t codes = N * nb * 16;
          uint8_t* q = reinterpret_cast<uint8_t*>(add_buffer(size_t(codes + N * nb * 2)));
          uint16_t* scale = reinterpret_cast<uint16_t*>(q + codes);
          fill_bf16(reinterpret_cast<uint16_t*>(q), size_t(codes / 2), uint64_t(l));
          for (int64_t i = 0; i < N * nb; ++i) scale[i] = 0x1419;  // f16 1e-3
          calls.push_back([=, &x](Build& bd, float* out) {
            bd.linear_int4(x.data(), q, scale, nullptr, nullptr, out, rows, N, K, bd.pool,
                           row_kind);
          });
        } else if (int8) {
          int8_t* q = reinterpret_cast<int8_t*>(add_buffer(size_t(N * K + N * nb * 4)));
          float* scale = reinterpret_cast<float*>(q + N * K);
          fill_bf16(reinterpret_cast<uint16_t*>(q), size_t(N * K / 2), uint64_t(l));
          for (int64_t i = 0; i < N * nb; ++i) scale[i] = 1e-3f;
          calls.push_back([=, &x](Build& bd, float* out) {
            bd.linear_int8(x.data(), q, scale, nullptr, out, rows, N, K, bd.pool, row_kind);
          });
        } else {
          uint16_t* w = reinterpret_cast<uint16_t*>(add_buffer(size_t(N * K * 2)));
          fill_bf16(w, size_t(N * K), uint64_t(l));
          calls.push_back([=, &x](Build& bd, float* out) {
            bd.linear(x.data(), w, kBf16, nullptr, out, rows, N, K, bd.pool, row_kind);
          });
        }
      }
  } else {
    die("unknown mode " + mode +
        " (attention, paged-attention, linear-bf16, linear-int8, linear-int4)");
  }
  size_t bytes = 0;
  for (const auto& buf : buffers) bytes += buf.size();

  std::vector<float> out_a(out_size, 0.0f), out_b(out_size, 0.0f);
  auto run_all = [&](Build& bd, std::vector<float>& out) {
    return seconds([&] {
      for (auto& c : calls) c(bd, out.data());
    });
  };
  const Alternated t = alternate(
      rounds, [&] { return run_all(a, out_a); }, [&] { return run_all(b, out_b); });
  const std::vector<double>&ta = t.old_s, &tb = t.new_s, &ratio = t.ratio;
  double max_diff = 0;
  for (size_t i = 0; i < out_a.size(); ++i)
    max_diff = std::max(max_diff, double(std::fabs(out_a[i] - out_b[i])));
  std::vector<double> tr;
  volatile uint64_t sink = 0;
  for (int r = 0; r < 3; ++r)
    tr.push_back(seconds([&] {
      for (const auto& buf : buffers)
        sink = sink + tformers::stream_sum(reinterpret_cast<const uint64_t*>(buf.data()), 0,
                                           int64_t(buf.size() / 8));
    }));
  std::printf(
      "%s, %d thread%s: old %.2f ms (%.1f GB/s), new %.2f ms (%.1f GB/s); old/new median of %d "
      "rounds %.3f; max |old - new| %.2g; read loop (1 thread) %.1f GB/s\n",
      mode.c_str(), threads, threads > 1 ? "s" : "", median(ta) * 1e3,
      double(bytes) / median(ta) / 1e9, median(tb) * 1e3, double(bytes) / median(tb) / 1e9, rounds,
      median(ratio), max_diff, double(bytes) / median(tr) / 1e9);
  return 0;
}
