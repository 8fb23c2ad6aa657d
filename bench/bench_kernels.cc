// Kernel benchmark: linear against the limits of this machine, all measured in the same run.
//   1. streaming-read bandwidth (sum over a 1 GiB buffer, median of several passes);
//   2. decode linear (M = 1, bf16 weights) at the Qwen3-0.6B shapes: weight GB/s and the
//      fraction of (1);
//   3. prefill linear (M = 128, 512): GFLOP/s against a register-only FMA peak loop (and, on
//      AVX-512 BF16 machines, the vdpbf16ps peak, which is what bf16 prefill can reach); on
//      AVX-512, the same FMAs with a load from L1 each (what bounds a tile that loads x per FMA);
//   4. attention with a bf16 cache at the Qwen3-0.6B head layout (16 query heads, 8 KV heads,
//      head_dim 128): prefill of 512 tokens (GFLOP/s), and one decode step at a used length of
//      256 in a 512-slot and a 32768-slot cache (the cost must follow the used length), and one
//      at a used length of 4096 over 28 layers' caches (GB/s of K and V against (1));
//   5. int8 quantization at load of the LM head (GB/s of bf16), this target against scalar;
//   6. the MXFP4 linear at gpt-oss-20b's expert shapes (N = 5760 and 2880, K = 2880): one row
//      (GB/s of the 17 bytes per 32 weights read, against (1)) and 32 rows (GFLOP/s against the
//      FMA peak);
// each with 1 and 2 threads. Usage: bench_kernels [--target NAME] [--gib N] [--mxfp4-only]
// (TFORMERS_CPU_TARGET also lowers the target).
// GCC 12's AVX-512 headers build "undefined" vectors by self-initialization, which -Wall
// reports at every inlined call although the value is never read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels.h"
#include "bench_help.h"
#include "core/cpu_features.h"
#include "core/stream_read.h"
#include "core/thread_pool.h"
#include "peak.h"
#include "tformers/dtype.h"

using namespace tformers;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median wall time of `reps` runs of fn, after one warm-up run.
double median_time(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    fn();
    t.push_back(now_s() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ---- 1. streaming-read bandwidth (core/stream_read.h).
volatile uint64_t g_sink;

// Sums `pieces` buffers of n bytes each, one piece per timed run (cycling), split over the pool.
double read_bandwidth(const std::vector<const void*>& pieces, int64_t bytes, int reps,
                      ThreadPool& pool) {
  const int64_t n = bytes / 8;
  std::vector<uint64_t> partial(size_t(pool.num_threads()) * 8);
  size_t next = 0;
  const double t = median_time(reps, [&] {
    const uint64_t* buf = static_cast<const uint64_t*>(pieces[next++ % pieces.size()]);
    pool.parallel_for(
        n, [&](int64_t b, int64_t e, int th) { partial[size_t(th) * 8] = stream_sum(buf, b, e); },
        1 << 16);
    uint64_t total = 0;
    for (auto v : partial) total += v;
    g_sink = total;
  });
  return double(n) * 8 / t / 1e9;
}

// ---- 6. the MXFP4 linear.
struct Mxfp4Weights {
  std::vector<uint8_t> codes, scales;
};

// Copies of an (N, K) MXFP4 weight, at least 1 GiB in all, so that a call of one row reads its
// weights from memory as a model's decode step does: random codes (xorshift64, 8 bytes a draw)
// and scales 110..135, about gpt-oss's.
std::vector<Mxfp4Weights> mxfp4_copies(int64_t N, int64_t K) {
  const size_t code_bytes = size_t(N * K / 2), scale_bytes = size_t(N * K / cpu::kMxfp4Block);
  const size_t copies = (size_t(1) << 30) / (code_bytes + scale_bytes) + 1;
  uint64_t state = 0x9e3779b97f4a7c15u;
  auto draw = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  std::vector<Mxfp4Weights> out(copies);
  for (Mxfp4Weights& w : out) {
    w.codes.resize(code_bytes);
    for (size_t i = 0; i < code_bytes; i += 8) {
      const uint64_t r = draw();
      std::memcpy(w.codes.data() + i, &r, std::min<size_t>(8, code_bytes - i));
    }
    w.scales.resize(scale_bytes);
    for (uint8_t& b : w.scales) b = uint8_t(110 + draw() % 26);
  }
  return out;
}

// gpt-oss-20b's expert linears (gate and up fused: N = 5760; down: 2880, the first rows of the
// same copies) for one decode row, from memory, and a prompt's 32 rows.
void bench_mxfp4(const std::vector<Mxfp4Weights>& copies, int64_t K, double bw, double peak,
                 ThreadPool& pool) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(size_t(32 * K)), y(size_t(32 * 5760));
  for (float& v : x) v = dist(rng);
  for (int64_t N : {5760, 2880}) {
    const double bytes = double(N * K / 2 + N * K / cpu::kMxfp4Block);
    size_t next = 0;
    const double t1 = median_time(200, [&] {
      const Mxfp4Weights& w = copies[next++ % copies.size()];
      cpu::linear_mxfp4(x.data(), w.codes.data(), w.scales.data(), nullptr, y.data(), 1, N, K, pool,
                        cpu::LinearRows::kDecode);
    });
    std::printf(
        "linear_mxfp4 M=1  N=%lld K=%lld: %8.1f us  %6.1f GB/s  %5.1f%% of the 1 GiB read\n",
        (long long)N, (long long)K, t1 * 1e6, bytes / t1 / 1e9, 100.0 * bytes / t1 / 1e9 / bw);
    const int64_t M = 32;
    const double t32 = median_time(9, [&] {
      cpu::linear_mxfp4(x.data(), copies[0].codes.data(), copies[0].scales.data(), nullptr,
                        y.data(), M, N, K, pool, cpu::LinearRows::kAny);
    });
    const double gflops = 2.0 * double(M * N * K) / t32 / 1e9;
    std::printf("linear_mxfp4 M=%lld N=%lld K=%lld: %8.1f us  %6.1f GFLOP/s  %5.1f%% of f32 peak\n",
                (long long)M, (long long)N, (long long)K, t32 * 1e6, gflops, 100.0 * gflops / peak);
  }
}

}  // namespace

const char* const kUsage =
    R"(usage: bench_kernels [--target scalar|avx2|avx512|avx512bf16] [--gib N] [--mxfp4-only]
Linear, attention and quantization kernels against this machine's streaming-read bandwidth and
FMA peak, measured in the same run, with 1 and 2 threads. --mxfp4-only: the bandwidth, the peak
and the MXFP4 linears alone.
)";

int main(int argc, char** argv) {
  if (tformers::bench::answered_help(argc, argv, kUsage)) return 0;
  double gib = 1.0;
  bool mxfp4_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--target" && i + 1 < argc) {
      const std::string name = argv[++i];
      for (cpu::Target t : cpu::supported_targets())
        if (cpu::target_name(t) == name) cpu::set_active_target(t);
    } else if (a == "--gib" && i + 1 < argc) {
      gib = std::atof(argv[++i]);
    } else if (a == "--mxfp4-only") {
      mxfp4_only = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--target scalar|avx2|avx512|avx512bf16] [--gib N] [--mxfp4-only]\n",
                   argv[0]);
      return 2;
    }
  }
  const cpu::Target target = cpu::active_target();
  std::printf("target %s (detected %s; features: %s)\n",
              std::string(cpu::target_name(target)).c_str(),
              std::string(cpu::target_name(cpu::detected_target())).c_str(),
              std::string(cpu::feature_string()).c_str());

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random_bf16 = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& h : v) h = f32_to_bf16(dist(rng) * 0.05f);
    return v;
  };
  auto random_f32 = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& f : v) f = dist(rng);
    return v;
  };

  std::vector<uint64_t> buf(size_t(gib * double(1ull << 30)) / 8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;
  const int64_t mxfp4_k = 2880;
  const std::vector<Mxfp4Weights> mxfp4_w = mxfp4_copies(5760, mxfp4_k);
  if (mxfp4_only) {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::printf("\n== %d thread%s\n", threads, threads > 1 ? "s" : "");
      const double bw = read_bandwidth({buf.data()}, int64_t(buf.size() * 8), 5, pool);
      const double peak = bench::peak_gflops(bench::f32_peak_loop(target), pool);
      std::printf("streaming read (%.1f GiB, median of 5): %.1f GB/s\n", gib, bw);
      std::printf("f32 FMA peak (registers only): %.1f GFLOP/s\n", peak);
      bench_mxfp4(mxfp4_w, mxfp4_k, bw, peak, pool);
    }
    return 0;
  }

  // Decode shapes: the MLP up/gate projection and the tied LM head of Qwen3-0.6B.
  const int64_t K = 1024;
  const int64_t decode_n[] = {3072, 151936};
  std::vector<std::vector<std::vector<uint16_t>>> decode_w;  // [shape][copy]
  for (int64_t N : decode_n) {
    const size_t bytes = size_t(N * K * 2), copies = std::max<size_t>(1, (size_t(1) << 30) / bytes);
    // Distinct contents: a hypervisor may merge identical pages, which would leave one cached copy.
    decode_w.emplace_back();
    for (size_t c = 0; c < copies; ++c) decode_w.back().push_back(random_bf16(size_t(N * K)));
  }
  // The KV caches of a long-context decode step (Qwen3-0.6B: 28 layers, 8 KV heads of 128),
  // filled with small bf16 values of a cheap hash (the values do not matter, only that they are
  // finite and distinct).
  constexpr int64_t kLongLayers = 28, kLongUsed = 4096;
  std::vector<uint16_t> long_kv(size_t(kLongLayers * 2 * 8 * kLongUsed * 128));
  for (size_t i = 0; i < long_kv.size(); ++i)
    long_kv[i] = uint16_t(0x3c00 | ((i * 2654435761u) >> 20 & 0x1ff));
  const int64_t prefill_n = 3072;
  const std::vector<uint16_t>& prefill_w = decode_w[0][0];
  std::vector<float> x = random_f32(size_t(512 * K));
  std::vector<float> y(size_t(512 * std::max<int64_t>(prefill_n, decode_n[1])));

  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    std::printf("\n== %d thread%s\n", threads, threads > 1 ? "s" : "");
    const double bw = read_bandwidth({buf.data()}, int64_t(buf.size() * 8), 5, pool);
    std::printf("streaming read (%.1f GiB, median of 5): %.1f GB/s\n", gib, bw);
    double bw_small = 0;
    {
      // The same read over the decode weight copies: what the small decode shape can expect.
      std::vector<const void*> pieces;
      for (const auto& c : decode_w[0]) pieces.push_back(c.data());
      bw_small = read_bandwidth(pieces, int64_t(decode_w[0][0].size() * 2), 200, pool);
      std::printf("streaming read (%zu pieces of %.1f MiB, median of 200): %.1f GB/s\n",
                  pieces.size(), double(decode_w[0][0].size() * 2) / (1 << 20), bw_small);
    }
    for (size_t i = 0; i < decode_w.size(); ++i) {
      const int64_t N = decode_n[i];
      // Weights smaller than the caches are cycled through copies (>= 1 GiB in all) so that
      // every call reads them from memory, as decode does with a whole model.
      const int reps = N > 100000 ? 10 : 200;
      size_t next = 0;
      const double t = median_time(reps, [&] {
        const auto& w = decode_w[i][next++ % decode_w[i].size()];
        cpu::linear(x.data(), w.data(), DType::bf16, nullptr, y.data(), 1, N, K, pool);
      });
      const double gbs = double(N * K * 2) / t / 1e9;
      // The small shape is compared with the read of the same 6 MiB pieces, the LM head with
      // the long stream.
      const double ref = i == 0 ? bw_small : bw;
      std::printf("linear M=1 bf16 N=%-6lld K=%lld: %8.1f us  %6.1f GB/s  %5.1f%% of the %s read\n",
                  (long long)N, (long long)K, t * 1e6, gbs, 100.0 * gbs / ref,
                  i == 0 ? "piecewise" : "1 GiB");
    }
    {
      // int8 quantization at load (--quantize int8) of the LM head, on this target and on the
      // scalar reference: GB/s of bf16 read.
      const int64_t N = decode_n[1];
      std::vector<int8_t> q(size_t(N * K));
      std::vector<float> qs(size_t(N * cpu::int8_blocks(K)));
      for (cpu::Target t : {target, cpu::Target::kScalar}) {
        cpu::set_active_target(t);
        const double tq = median_time(3, [&] {
          cpu::quantize_int8(decode_w[1][0].data(), DType::bf16, q.data(), qs.data(), N, K, pool);
        });
        std::printf("quantize_int8 bf16 N=%lld K=%lld (%s): %8.1f ms  %6.2f GB/s\n", (long long)N,
                    (long long)K, std::string(cpu::target_name(t)).c_str(), tq * 1e3,
                    double(N * K * 2) / tq / 1e9);
      }
      cpu::set_active_target(target);
    }
    const double peak = bench::peak_gflops(bench::f32_peak_loop(target), pool);
    std::printf("f32 FMA peak (registers only): %.1f GFLOP/s\n", peak);
    if (target >= cpu::Target::kAVX512)
      std::printf("f32 FMA with a 64-byte load from L1 each: %.1f GFLOP/s\n",
                  bench::peak_gflops(&bench::fma_load_loop_avx512, pool));
    double bf16_peak = 0;
    if (target >= cpu::Target::kAVX512BF16) {
      bf16_peak = bench::peak_gflops(bench::matmul_peak_loop(target), pool);
      std::printf("bf16 dot peak (%s): %.1f GFLOP/s\n",
                  target >= cpu::Target::kAMX ? "AMX tiles" : "vdpbf16ps", bf16_peak);
    }
    for (int64_t M : {128, 512}) {
      for (DType wt : {DType::bf16, DType::f32}) {
        std::vector<float> wf;
        const void* w = prefill_w.data();
        if (wt == DType::f32) {
          wf.resize(prefill_w.size());
          for (size_t j = 0; j < wf.size(); ++j) wf[j] = bf16_to_f32(prefill_w[j]);
          w = wf.data();
        }
        const double t = median_time(
            3, [&] { cpu::linear(x.data(), w, wt, nullptr, y.data(), M, prefill_n, K, pool); });
        const double gflops = 2.0 * double(M * prefill_n * K) / t / 1e9;
        const double ref_peak = (wt == DType::bf16 && bf16_peak > 0) ? bf16_peak : peak;
        std::printf(
            "linear M=%-3lld %-8s N=%lld K=%lld: %8.2f ms  %6.1f GFLOP/s  %5.1f%% of %s peak\n",
            (long long)M, std::string(dtype_name(wt)).c_str(), (long long)prefill_n, (long long)K,
            t * 1e3, gflops, 100.0 * gflops / ref_peak, ref_peak == bf16_peak ? "bf16" : "f32");
      }
    }
    {
      const int64_t Hq = 16, Hkv = 8, D = 128, T = 512;
      const std::vector<uint16_t>& kv = decode_w[1][0];  // any bf16 values will do
      std::vector<float> q = random_f32(size_t(T * Hq * D)), out(q.size());
      const float scale = 1.0f / std::sqrt(float(D));
      const double t = median_time(3, [&] {
        cpu::attention(q.data(), kv.data(), kv.data() + Hkv * T * D, DType::bf16, nullptr,
                       out.data(), 1, T, Hq, Hkv, T, D, 0, scale, pool);
      });
      // QK^T and PV over the causal triangle.
      const double flops = 2.0 * 2.0 * double(Hq) * double(T) * double(T + 1) / 2.0 * double(D);
      std::printf("attention prefill T=%lld bf16 cache: %8.2f ms  %6.1f GFLOP/s\n", (long long)T,
                  t * 1e3, flops / t / 1e9);
      for (int64_t S : {512, 32768}) {
        const double td = median_time(50, [&] {
          cpu::attention(q.data(), kv.data(), kv.data() + Hkv * S * D, DType::bf16, nullptr,
                         out.data(), 1, 1, Hq, Hkv, S, D, 255, scale, pool);
        });
        std::printf("attention decode used=256 S=%-5lld: %8.1f us\n", (long long)S, td * 1e6);
      }
      // A decode step at a long used length over every layer, each with its own cache, so K and
      // V come from memory as in the model: GB/s of K and V against the 1 GiB read.
      const double tl = median_time(5, [&] {
        for (int64_t l = 0; l < kLongLayers; ++l) {
          const uint16_t* kl = long_kv.data() + size_t(l * 2 * Hkv * kLongUsed * D);
          cpu::attention(q.data(), kl, kl + Hkv * kLongUsed * D, DType::bf16, nullptr, out.data(),
                         1, 1, Hq, Hkv, kLongUsed, D, kLongUsed - 1, scale, pool);
        }
      });
      const double kv_gbs = double(long_kv.size() * 2) / tl / 1e9;
      std::printf(
          "attention decode used=%lld x %lld layers: %8.2f ms  K+V %5.1f GB/s  %5.1f%% of the 1 "
          "GiB read\n",
          (long long)kLongUsed, (long long)kLongLayers, tl * 1e3, kv_gbs, 100.0 * kv_gbs / bw);
    }
    bench_mxfp4(mxfp4_w, mxfp4_k, bw, peak, pool);
  }
  return 0;
}
