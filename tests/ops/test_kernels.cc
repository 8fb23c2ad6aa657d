// Op-consistency tests: every CPU kernel, on every target this CPU supports, for f32 and bf16
// weights / caches (and f16 weights where the kernels take them), against the scalar references
// in kernels_ref.cc; and the references themselves against small cases computed by hand, so a
// wrong reference cannot hide.
//
// Error measure (as llama.cpp's test-backend-ops): normalized mean squared error
//   NMSE = sum_i (y_i - r_i)^2 / sum_i r_i^2
// plus the largest element error relative to |r_i| + rms(r).
//
// Tolerances follow from f32 rounding. The references accumulate in double, so the difference
// is the target's own rounding. With unit roundoff u = 2^-24, a sum of K products accumulated in
// f32 picks up at most one rounding of relative size u per addition; for zero-mean random terms
// the errors add like a random walk, so err^2 ~ u^2 * K * |y|^2 on average (each partial sum is
// about as large as y). We allow NMSE <= 16 * u^2 * (K + 16): a factor 16 of headroom for
// unlucky draws and the final conversions, and +16 so that K ~ 1 still admits a few roundings.
// Where x is rounded to bf16 before the products (AVX-512 BF16 prefill), each product carries
// an extra relative error of at most u_bf16 = 2^-8, independent across k, which adds at most
// u_bf16^2 to the NMSE whatever K is. The largest element error is allowed 8 standard
// deviations: 8 * sqrt(NMSE tolerance).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/cpu/kernels.h"
#include "backends/cpu/kernels_impl.h"
#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "ops/ops_test_util.h"
#include "tformers/dtype.h"

namespace tformers::cpu {

// avx512_emulated.cc: the AVX-512 BF16 target's kernels over emulated intrinsics (needs AVX2).
const KernelTable& emulated_avx512bf16_kernels();
// amx_emulated.cc: the AMX target's kernels over emulated tiles and intrinsics (needs AVX2).
const KernelTable& emulated_amx_kernels();

namespace {

// Restores the active target when a test ends, even on failure.
class TargetGuard {
 public:
  TargetGuard() : saved_(active_target()) {}
  ~TargetGuard() { set_active_target(saved_); }

 private:
  Target saved_;
};

// The kernel tables under test: every target this CPU runs, and the AVX-512 BF16 target's code
// over emulated AVX-512 intrinsics (avx512_emulated.cc), which needs AVX2. The AMX target's code
// over emulated tiles (amx_emulated.cc) differs from the latter in its bf16 linears, which
// Ops.AmxLinearRowsAgreeForEveryRowCount runs, and in its prefill attention over a bf16 cache,
// for which the attention tests take it too (kWithAmxEmulation); the tiny shapes of Ops.Linear
// are left to the real tiles, since an emulation's own roundings on them sit at the edge of the
// bf16 tolerance (K = 5: an NMSE of 2.0e-5 against 1.5e-5 on one draw).
struct Config {
  std::string name;
  Target target;  // what the table computes like (tolerances)
  const KernelTable* table;
};

std::vector<Config> configs(bool with_amx_emulation) {
  std::vector<Config> out;
  for (Target t : supported_targets())
    out.push_back({std::string(target_name(t)), t, &kernels_for(t)});
  if (detected_target() >= Target::kAVX2)
    out.push_back({"avx512bf16-emulated", Target::kAVX512BF16, &emulated_avx512bf16_kernels()});
  if (detected_target() >= Target::kAVX2 && with_amx_emulation)
    out.push_back({"amx-emulated", Target::kAMX, &emulated_amx_kernels()});
  return out;
}

// The storage dtypes of weights and KV caches; the weights of linear, embedding and rms_norm
// may also be f16.
constexpr DType kStored[] = {DType::f32, DType::bf16};
constexpr DType kF16[] = {DType::f16};

// Runs `body(kernels, target, dtype, pool, label)` for every table of configs(), each of
// `dtypes`, and pools of 1 and 3 threads (3 gives uneven chunks).
template <bool kWithAmxEmulation = false, class Body>
void for_each_config(Body body, std::span<const DType> dtypes = kStored) {
  ThreadPool pool1(1), pool3(3);
  for (const Config& c : configs(kWithAmxEmulation))
    for (DType dt : dtypes)
      for (ThreadPool* pool : {&pool1, &pool3})
        body(*c.table, c.target, dt, *pool,
             c.name + "/" + std::string(dtype_name(dt)) +
                 "/threads=" + std::to_string(pool->num_threads()));
}

// for_each_config over f32 and bf16 weights, then over f16 ones: the f16 draws come last, so the
// others' random values stay those their tolerances were checked on.
template <class Body>
void for_each_weight_config(Body body) {
  for_each_config(body);
  for_each_config(body, kF16);
}

// ------------------------------------------------------------------------------------ dispatch

TEST(Dispatch, TargetsAreSupportedAndRestorable) {
  const auto targets = supported_targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(targets.front(), Target::kScalar);
  EXPECT_EQ(targets.back(), detected_target());
  EXPECT_LE(int(active_target()), int(detected_target()));
  TargetGuard guard;
  set_active_target(Target::kScalar);
  EXPECT_EQ(active_target(), Target::kScalar);
  if (detected_target() < Target::kAVX512BF16) {
    EXPECT_ANY_THROW(set_active_target(Target::kAVX512BF16));
    EXPECT_EQ(active_target(), Target::kScalar);
  }
}

// ------------------------------------------------------------------------------- linear

// Whether an x86 target's linear takes its GEMM (the scalar target has one path): rows that may
// be a prompt's, from 4 of them; decode rows always take the GEMV.
bool gemm(int64_t M, LinearRows rows) { return rows == LinearRows::kAny && M >= 4; }
const char* rows_name(LinearRows rows) { return rows == LinearRows::kDecode ? " decode" : ""; }

// x as the int8 and int4 GEMVs that round it to int8 see it (kernels_x86.h's quantize_x8_block):
// each 32-value block of a row scaled by 127 / max|block|, rounded to nearest even, and
// multiplied back by max|block| / 127. The reference on these values differs from such a GEMV
// only by f32 roundings, so its tolerance stays that of f32 x.
std::vector<float> x_as_int8_blocks(const std::vector<float>& x, int64_t M, int64_t K) {
  std::vector<float> out(x.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b0 = 0; b0 < K; b0 += 32) {
      const float* xb = x.data() + m * K + b0;
      const int64_t len = std::min<int64_t>(32, K - b0);
      float amax = 0.0f;
      for (int64_t k = 0; k < len; ++k) amax = std::max(amax, std::fabs(xb[k]));
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, s = amax / 127.0f;
      for (int64_t k = 0; k < len; ++k)
        out[size_t(m * K + b0 + k)] = std::nearbyint(xb[k] * inv) * s;
    }
  return out;
}

TEST(Ops, Linear) {
  std::mt19937 rng(1234);
  for_each_weight_config([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                             const std::string& what) {
    for (const auto& c : kLinearCases)
      for (LinearRows rows : {LinearRows::kAny, LinearRows::kDecode}) {
        std::vector<float> x = random_f32(rng, size_t(c.M * c.K));
        Tensor w = random_tensor(rng, size_t(c.N * c.K), dt);
        Tensor b = random_tensor(rng, size_t(c.N), dt);
        std::vector<float> y(size_t(c.M * c.N), NAN), want(y.size());
        const void* bias = c.bias ? b.data() : nullptr;
        kernels.linear(x.data(), w.data(), dt, bias, y.data(), c.M, c.N, c.K, pool, rows);
        ref::linear(x.data(), w.data(), dt, bias, want.data(), c.M, c.N, c.K);
        // The AVX-512 BF16 target rounds x to bf16 with bf16 weights, in its GEMV and its GEMM.
        const bool x_bf16 = t >= Target::kAVX512BF16 && dt == DType::bf16;
        expect_close(y, want, nmse_tolerance(c.K, x_bf16),
                     what + rows_name(rows) + " M=" + std::to_string(c.M) +
                         " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
      }
  });
}

// int8 weights with per-block scales: the same shapes as Ops.Linear (GEMV and GEMM paths, tails
// in K, partial last blocks, N tails). The int8 values widen to f32 exactly and each block's
// scale is one more rounding, so the f32 tolerance for 2K + 2 terms; the AVX2 GEMV also rounds
// x to int16 per 32-block (relative error at most 2^-16 of the block's largest |x|, independent
// across k), which adds at most (2^-15)^2 to the NMSE whatever K is, as bf16 x does in
// Ops.Linear (where the AVX-512 BF16 GEMM rounds x, as here).
TEST(Ops, LinearInt8) {
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int> qdist(-127, 127);
  for_each_config([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                      const std::string& what) {
    if (dt != DType::f32) return;  // one weight type; the dtype loop does not apply
    for (const auto& c : kLinearCases)
      for (LinearRows rows : {LinearRows::kAny, LinearRows::kDecode}) {
        std::vector<float> x = random_f32(rng, size_t(c.M * c.K));
        std::vector<int8_t> w(size_t(c.N * c.K));
        for (auto& v : w) v = int8_t(qdist(rng));
        std::vector<float> scale = random_f32(rng, size_t(c.N * int8_blocks(c.K)), 1e-3f, 1e-2f);
        std::vector<float> b = random_f32(rng, size_t(c.N));
        std::vector<float> y(size_t(c.M * c.N), NAN), want(y.size());
        const float* bias = c.bias ? b.data() : nullptr;
        kernels.linear_int8(x.data(), w.data(), scale.data(), bias, y.data(), c.M, c.N, c.K, pool,
                            rows);
        // The AVX-512 BF16 GEMM rounds x to bf16, as for bf16 weights in Ops.Linear, and its
        // GEMV to int8 per 32-block, as the int4 GEMVs do: the reference then takes x so rounded.
        const bool x_bf16 = t >= Target::kAVX512BF16 && gemm(c.M, rows);
        const bool x_int8 = t >= Target::kAVX512BF16 && !gemm(c.M, rows);
        const std::vector<float> xr = x_int8 ? x_as_int8_blocks(x, c.M, c.K) : x;
        ref::linear_int8(xr.data(), w.data(), scale.data(), bias, want.data(), c.M, c.N, c.K);
        expect_close(y, want, nmse_tolerance(2 * c.K + 2, x_bf16) + 0x1p-30,
                     what + rows_name(rows) + " int8 M=" + std::to_string(c.M) +
                         " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
      }
  });
}

// Quantization: every value within half a step of its original, the largest magnitude of each
// block at +-127, and an all-zero block stays zero with scale 0 (K = 300: 9 full blocks and a
// partial one).
TEST(Ops, QuantizeInt8RoundTrip) {
  std::mt19937 rng(99);
  for_each_config(
      [&](const KernelTable& kernels, Target, DType dt, ThreadPool& pool, const std::string& what) {
        const int64_t N = 7, K = 300;
        Tensor w = random_tensor(rng, size_t(N * K), dt, -3.0f, 3.0f);
        for (int64_t k = 0; k < K; ++k) {  // row 2 all zero
          w.f[size_t(2 * K + k)] = 0.0f;
          if (dt == DType::bf16) w.h[size_t(2 * K + k)] = 0;
        }
        std::vector<int8_t> q(size_t(N * K));
        const int64_t nb = int8_blocks(K);
        std::vector<float> scale(static_cast<size_t>(N * nb));
        kernels.quantize_int8(w.data(), dt, q.data(), scale.data(), N, K, pool);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t b = 0; b < nb; ++b) {
            const float sc = scale[size_t(n * nb + b)];
            float amax = 0;
            int qmax = 0;
            for (int64_t k = b * kInt8Block; k < std::min(K, (b + 1) * kInt8Block); ++k) {
              const float v = w.f[size_t(n * K + k)], r = sc * q[size_t(n * K + k)];
              amax = std::max(amax, std::abs(v));
              qmax = std::max(qmax, std::abs(int(q[size_t(n * K + k)])));
              ASSERT_LE(std::abs(v - r), 0.5f * sc * (1 + 1e-5f) + 1e-30f)
                  << what << " row " << n << " k " << k;
            }
            EXPECT_FLOAT_EQ(sc, amax / 127.0f) << what;
            EXPECT_EQ(qmax, n == 2 ? 0 : 127) << what << " row " << n << " block " << b;
          }
      });
}

// Every target quantizes to the scalar target's bytes: the same scales and the same
// round-to-nearest-even (K = 1000: 31 full blocks and a partial one; values spread over five
// orders of magnitude, and exact ties k + 0.5 in units of the step).
TEST(Ops, QuantizeInt8SameBytesOnEveryTarget) {
  std::mt19937 rng(7);
  const int64_t N = 5, K = 1000, nb = int8_blocks(K);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor w = random_tensor(rng, size_t(N * K), dt, -1.0f, 1.0f);
    for (size_t i = 0; i < w.f.size(); i += 7) w.f[i] *= float(std::pow(10.0, double(i % 5) - 2));
    // Row 1, block 0: max 127, the rest on half steps, so v * 127 / max lands on k + 0.5.
    for (int64_t k = 0; k < kInt8Block; ++k) w.f[size_t(K + k)] = k == 0 ? 127.0f : 0.5f + float(k);
    if (dt == DType::bf16)
      for (size_t i = 0; i < w.f.size(); ++i) {
        w.h[i] = f32_to_bf16(w.f[i]);
        w.f[i] = bf16_to_f32(w.h[i]);
      }
    TargetGuard guard;
    ThreadPool pool(2);
    std::vector<int8_t> want(size_t(N * K)), q(size_t(N * K));
    std::vector<float> want_scale(size_t(N * nb)), scale(size_t(N * nb));
    set_active_target(Target::kScalar);
    quantize_int8(w.data(), dt, want.data(), want_scale.data(), N, K, pool);
    for (Target t : supported_targets()) {
      set_active_target(t);
      quantize_int8(w.data(), dt, q.data(), scale.data(), N, K, pool);
      EXPECT_EQ(q, want) << target_name(t) << " " << dtype_name(dt);
      EXPECT_EQ(scale, want_scale) << target_name(t) << " " << dtype_name(dt);
    }
  }
}

// int4 weights in tiles (kernels.h): random codes, f16 scales, and zero points or the implicit 8,
// on the shapes of Ops.Linear with N rounded up to the 8 rows of a tile (GEMV and GEMM paths, K
// tails and partial last blocks, several row groups per stream part). The weights are exact in
// f32 (an f16 scale times a code difference), so the scalar target and the GEMMs differ from the
// reference only in summation order: the int8 tolerance. The x86 GEMVs (decode rows, M < 4)
// also round x to int8 per 32-block with its own scale, and the reference takes x rounded so
// (x_as_int8_blocks).
TEST(Ops, LinearInt4) {
  std::mt19937 rng(4444);
  std::uniform_int_distribution<int> code(0, 15), zp(0, 16);
  for_each_config([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                      const std::string& what) {
    for (bool with_zero : {false, true}) {
      if ((dt == DType::bf16) != with_zero) continue;  // the dtype loop picks the zero-point form
      for (const auto& c : kLinearCases)
        for (LinearRows rows : {LinearRows::kAny, LinearRows::kDecode}) {
          const int64_t N = (c.N + kInt4Rows - 1) / kInt4Rows * kInt4Rows, K = c.K;
          const int64_t nb = int4_blocks(K), tiles = N / kInt4Rows * nb;
          std::vector<float> x = random_f32(rng, size_t(c.M * K));
          std::vector<uint8_t> w(size_t(tiles * kInt4TileBytes)), zero(size_t(tiles * kInt4Rows));
          for (auto& v : w) v = uint8_t(code(rng) | code(rng) << 4);
          for (auto& v : zero) v = uint8_t(zp(rng));
          std::vector<uint16_t> scale;
          for (float v : random_f32(rng, size_t(tiles * kInt4Rows), 1e-3f, 1e-2f))
            scale.push_back(f32_to_f16(v));
          std::vector<float> b = random_f32(rng, size_t(N));
          std::vector<float> y(size_t(c.M * N), NAN), want(y.size());
          const float* bias = c.bias ? b.data() : nullptr;
          const uint8_t* z = with_zero ? zero.data() : nullptr;
          kernels.linear_int4(x.data(), w.data(), scale.data(), z, bias, y.data(), c.M, N, K, pool,
                              rows);
          const bool x_int8 = t != Target::kScalar && !gemm(c.M, rows);
          const bool x_bf16 = t >= Target::kAVX512BF16 && gemm(c.M, rows);  // the BF16 GEMM's x
          const std::vector<float> xr = x_int8 ? x_as_int8_blocks(x, c.M, K) : x;
          ref::linear_int4(xr.data(), w.data(), scale.data(), z, bias, want.data(), c.M, N, K);
          expect_close(y, want, nmse_tolerance(2 * K + 2, x_bf16),
                       what + rows_name(rows) + (with_zero ? " int4+zero" : " int4") +
                           " M=" + std::to_string(c.M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K));
        }
    }
  });
}

// The serving engine needs a decode row's result to be the same whatever the other rows are:
// decode rows of x repeated in calls of 1 to 13 rows (passes of 4, 2 and 1 rows) give
// bit-identical outputs, for float, int8 and int4 weights, on every target and pool, also where
// the weights take several L2 chunks (N = 200, K = 1000: 800 KB of f32). Rows that may be a
// prompt's are independent of M from 4 rows (the GEMM); below that the x86 targets take the GEMV,
// which rounds x to int8 per block for int4 weights, so the rows differ there: the two paths are
// different kernels.
TEST(Ops, LinearRowsIndependentOfM) {
  std::mt19937 rng(555);
  // Not a structured binding: the lambda captures N and K, which clang accepts only from
  // version 16 (the sanitizer builds' clang is 14).
  for (const auto& shape : {std::pair<int64_t, int64_t>{72, 300}, {200, 1000}}) {
    const int64_t N = shape.first, K = shape.second;
    for_each_config([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                        const std::string& what) {
      std::vector<float> x = random_f32(rng, size_t(13 * K));
      Tensor w = random_tensor(rng, size_t(N * K), dt);
      std::vector<int8_t> q8(size_t(N * K));
      std::vector<float> s8(size_t(N * int8_blocks(K)));
      kernels.quantize_int8(w.data(), dt, q8.data(), s8.data(), N, K, pool);
      std::vector<uint8_t> q4(size_t(N / kInt4Rows * int4_blocks(K) * kInt4TileBytes));
      std::vector<uint16_t> s4(size_t(N * int4_blocks(K)));
      quantize_int4(w.data(), dt, q4.data(), s4.data(), N, K, pool);
      auto run = [&](int kind, int64_t M, LinearRows rows) {
        std::vector<float> y(size_t(M * N), NAN);
        if (kind == 0)
          kernels.linear(x.data(), w.data(), dt, nullptr, y.data(), M, N, K, pool, rows);
        if (kind == 1)
          kernels.linear_int8(x.data(), q8.data(), s8.data(), nullptr, y.data(), M, N, K, pool,
                              rows);
        if (kind == 2)
          kernels.linear_int4(x.data(), q4.data(), s4.data(), nullptr, nullptr, y.data(), M, N, K,
                              pool, rows);
        return y;
      };
      for (LinearRows rows : {LinearRows::kDecode, LinearRows::kAny}) {
        if (rows == LinearRows::kAny && K > 300) continue;  // the GEMM has no chunks
        const char* name = rows == LinearRows::kDecode ? " decode" : " any";
        for (int kind : {0, 1, 2}) {
          const std::vector<float> all = run(kind, 13, rows);
          for (int64_t M = rows == LinearRows::kDecode ? 1 : 4; M < 13; ++M) {
            const std::vector<float> part = run(kind, M, rows);
            EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin()))
                << what << name << " weights " << kind << " M=" << M;
          }
        }
      }
      if (t != Target::kScalar) {  // x86: the GEMV and the GEMM are two kernels
        const std::vector<float> gemm = run(2, 13, LinearRows::kAny),
                                 gemv = run(2, 13, LinearRows::kDecode);
        EXPECT_FALSE(std::equal(gemv.begin(), gemv.end(), gemm.begin())) << what;
      }
    });
  }
}

// ------------------------------------------------------------------------ MXFP4 weights

// MXFP4 weights as a checkpoint stores them (kernels.h): codes (N, K / 2), scales (N, K / 32).
struct Mxfp4Weights {
  std::vector<uint8_t> codes, scales;
};

// Random code bytes (every nibble equally likely) and scale bytes drawn from `scale_bytes`.
Mxfp4Weights random_mxfp4(std::mt19937& rng, int64_t N, int64_t K,
                          const std::vector<uint8_t>& scale_bytes) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<size_t> pick(0, scale_bytes.size() - 1);
  Mxfp4Weights w{std::vector<uint8_t>(size_t(N * K / 2)),
                 std::vector<uint8_t>(size_t(N * K / kMxfp4Block))};
  for (auto& c : w.codes) c = uint8_t(byte(rng));
  for (auto& s : w.scales) s = scale_bytes[pick(rng)];
  return w;
}

// The scale bytes of gpt-oss-like weights: 2^-17 to 2^8.
std::vector<uint8_t> realistic_scales() {
  std::vector<uint8_t> out;
  for (int s = 110; s <= 135; ++s) out.push_back(uint8_t(s));
  return out;
}

// An e2m1 code's value from the format's definition (OCP MX): sign bit 3, exponent bits 2-1 with
// bias 1, mantissa bit 0; exponent 0 is subnormal, 0.m * 2^0.
double e2m1_by_definition(int code) {
  const int exponent = code >> 1 & 3, mantissa = code & 1;
  const double magnitude =
      exponent == 0 ? 0.5 * mantissa : std::ldexp(1.0 + 0.5 * mantissa, exponent - 1);
  return code & 8 ? -magnitude : magnitude;
}

// y = x @ w^T + bias in double from the definitions: byte i of a row's codes holds k = 2 i (low
// nibble) and 2 i + 1 (high), and an e8m0 byte s is 2^(s - 127).
std::vector<double> mxfp4_linear_f64(const std::vector<float>& x, const Mxfp4Weights& w,
                                     const float* bias, int64_t M, int64_t N, int64_t K) {
  std::vector<double> y(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = w.codes[size_t(n * K / 2 + k / 2)];
        const double scale = std::ldexp(1.0, w.scales[size_t(n * K / 32 + k / 32)] - 127);
        acc += double(x[size_t(m * K + k)]) *
               (e2m1_by_definition(k % 2 ? byte >> 4 : byte & 15) * scale);
      }
      y[size_t(m * N + n)] = acc;
    }
  return y;
}

// The reference against the format by hand and against mxfp4_linear_f64: each product is exact
// in double (an f32 times a value of 2 significant bits and a power of two) and both sum in k
// order from the bias, so they agree to the bit, over every scale byte.
TEST(Reference, LinearMxfp4FollowsTheFormat) {
  // Row 0: k = 0 code 7 (6), k = 1 code 9 (-0.5), scale 128 (2); row 1: k = 2 code 1 (0.5) at
  // scale 0 (2^-127), a weight of 2^-128, below f32's normal range.
  std::vector<uint8_t> codes(32, 0), scales = {128, 0};
  codes[0] = 0x97;
  codes[16 + 1] = 0x01;
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;
  x[1] = 2.0f;
  x[2] = 0x1p100f;
  const float bias[2] = {0.25f, 0.0f};
  float y[2];
  ref::linear_mxfp4(x.data(), codes.data(), scales.data(), bias, y, 1, 2, 32);
  EXPECT_EQ(y[0], 6.0f * 2 * 1 - 0.5f * 2 * 2 + 0.25f);  // 10.25
  EXPECT_EQ(y[1], 0x1p-28f);

  std::mt19937 rng(2880);
  const int64_t M = 3, N = 5, K = 96;
  std::vector<uint8_t> every_scale(255);
  std::iota(every_scale.begin(), every_scale.end(), uint8_t{0});
  const Mxfp4Weights w = random_mxfp4(rng, N, K, every_scale);
  const std::vector<float> xs = random_f32(rng, size_t(M * K)), b = random_f32(rng, size_t(N));
  std::vector<float> got(size_t(M * N));
  ref::linear_mxfp4(xs.data(), w.codes.data(), w.scales.data(), b.data(), got.data(), M, N, K);
  const std::vector<double> want = mxfp4_linear_f64(xs, w, b.data(), M, N, K);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], float(want[i])) << i;
}

// Shapes for linear_mxfp4: N that are not multiples of 8 or 16; K of one block (32), two (64),
// groups of 4 blocks with 1 to 3 left over (96, 160, 224) and gpt-oss's 2880 (90 blocks: 22
// groups of 4 and 2 left, and several chunks of the GEMM); M of 1 to 4 (the x86 GEMV, several
// weight rows side by side and rows left over) and past 4 (the GEMM's tiles of 4 x rows, with a
// remainder).
constexpr LinearCase kMxfp4Cases[] = {
    {1, 1, 32, false},     {1, 37, 32, true},   {1, 301, 2880, false}, {2, 13, 64, true},
    {3, 100, 96, false},   {4, 17, 160, true},  {7, 40, 2880, false},  {16, 33, 224, true},
    {33, 70, 2880, false}, {2, 300, 2880, true}};

// Every target against the reference on random codes and realistic scales (110..135, as
// gpt-oss's): the weights are exact in f32 and x stays f32, so only f32 rounding of the products
// and sums in another order separate them: the int8 tolerance. Both kinds of rows, which take
// the same path.
TEST(Ops, LinearMxfp4) {
  std::mt19937 rng(20);
  for (const auto& c : kMxfp4Cases) {
    const Mxfp4Weights w = random_mxfp4(rng, c.N, c.K, realistic_scales());
    const std::vector<float> x = random_f32(rng, size_t(c.M * c.K)),
                             b = random_f32(rng, size_t(c.N));
    const float* bias = c.bias ? b.data() : nullptr;
    std::vector<float> want(size_t(c.M * c.N));
    ref::linear_mxfp4(x.data(), w.codes.data(), w.scales.data(), bias, want.data(), c.M, c.N, c.K);
    for_each_config([&](const KernelTable& kernels, Target, DType dt, ThreadPool& pool,
                        const std::string& what) {
      if (dt != DType::f32) return;  // one weight type; the dtype loop does not apply
      for (LinearRows rows : {LinearRows::kAny, LinearRows::kDecode}) {
        std::vector<float> y(want.size(), NAN);
        kernels.linear_mxfp4(x.data(), w.codes.data(), w.scales.data(), bias, y.data(), c.M, c.N,
                             c.K, pool, rows);
        expect_close(y, want, nmse_tolerance(2 * c.K + 2),
                     what + rows_name(rows) + " mxfp4 M=" + std::to_string(c.M) +
                         " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
      }
    });
  }
}

// The ends of the scale range, where the weights leave f32's normal range: scales 0 to 2 (weights
// from 2^-128, subnormal) against x near 2^100, and 252 to 254 (weights up to 6 * 2^127, past
// f32's largest value) against x near 2^-120; the outputs are normal f32 values either way,
// and the kernels must reach them as the reference does, without an infinity or a lost weight.
TEST(Ops, LinearMxfp4ExtremeScales) {
  std::mt19937 rng(254);
  const int64_t N = 19, K = 2880;
  // Not structured bindings: the lambda below captures them, which clang accepts only from
  // version 16 (the sanitizer builds' clang is 14).
  const std::pair<std::vector<uint8_t>, float> regimes[] = {{{0, 1, 2}, 0x1p100f},
                                                            {{252, 253, 254}, 0x1p-120f}};
  for (const auto& regime : regimes)
    for (int64_t M : {3, 9}) {
      const std::vector<uint8_t>& scale_bytes = regime.first;
      const float x_scale = regime.second;
      const Mxfp4Weights w = random_mxfp4(rng, N, K, scale_bytes);
      std::vector<float> x = random_f32(rng, size_t(M * K));
      for (float& v : x) v *= x_scale;
      std::vector<float> want(size_t(M * N));
      ref::linear_mxfp4(x.data(), w.codes.data(), w.scales.data(), nullptr, want.data(), M, N, K);
      for (float v : want) ASSERT_TRUE(std::isnormal(v)) << v;
      for_each_config([&](const KernelTable& kernels, Target, DType dt, ThreadPool& pool,
                          const std::string& what) {
        if (dt != DType::f32) return;
        std::vector<float> y(want.size(), NAN);
        kernels.linear_mxfp4(x.data(), w.codes.data(), w.scales.data(), nullptr, y.data(), M, N, K,
                             pool, LinearRows::kAny);
        expect_close(y, want, nmse_tolerance(2 * K + 2),
                     what + " scales " + std::to_string(scale_bytes[0]) + ".." +
                         std::to_string(scale_bytes.back()) + " M=" + std::to_string(M));
      });
    }
}

// A row's bits depend on nothing but itself: the first M rows of x give exactly the first M rows
// of a 70-row call, for M from 1 to 65 (the GEMV, the GEMM's tiles of x rows and its blocks of
// 64 rows), decode rows and a prompt's alike, on every pool (N = 70: the GEMM's blocks of weight
// rows and a remainder; K = 2880: several chunks of the GEMM).
TEST(Ops, LinearMxfp4RowsIndependentOfM) {
  std::mt19937 rng(70);
  const int64_t all = 70, N = 70, K = 2880;
  const Mxfp4Weights w = random_mxfp4(rng, N, K, realistic_scales());
  const std::vector<float> x = random_f32(rng, size_t(all * K)), b = random_f32(rng, size_t(N));
  ThreadPool pool1(1), pool3(3);
  for (const Config& config : configs(/*with_amx_emulation=*/false)) {
    auto run = [&](int64_t M, LinearRows rows, ThreadPool& pool) {
      std::vector<float> y(size_t(M * N), NAN);
      config.table->linear_mxfp4(x.data(), w.codes.data(), w.scales.data(), b.data(), y.data(), M,
                                 N, K, pool, rows);
      return y;
    };
    const std::vector<float> whole = run(all, LinearRows::kAny, pool1);
    for (ThreadPool* pool : {&pool1, &pool3})
      for (LinearRows rows : {LinearRows::kAny, LinearRows::kDecode})
        for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 33, 65}) {
          const std::vector<float> part = run(M, rows, *pool);
          EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin()))
              << config.name << rows_name(rows) << " threads=" << pool->num_threads() << " M=" << M;
        }
  }
}

// The AMX target (and its code over emulated tiles) runs every linear of bf16 weights, prompt
// rows and decode rows, on its tiles, where each output is one accumulator over k in order: any
// row count gives a row the same bits, past one tile of 16 x rows, a pair of tiles (32) and a
// group (128), and a prompt's rows those of decode rows. Shapes: blocks of 32 weight rows read in
// place (N = 64, K = 320), a last block of fewer rows (N = 72) and a K tail (K = 300), both copied
// with zeros around them.
TEST(Ops, AmxLinearRowsAgreeForEveryRowCount) {
  std::vector<Config> amx;
  for (const Config& c : configs(/*with_amx_emulation=*/true))
    if (c.target == Target::kAMX) amx.push_back(c);
  if (amx.empty()) GTEST_SKIP() << "no AMX and no AVX2 on this CPU";
  std::mt19937 rng(321);
  ThreadPool pool1(1), pool3(3);
  const int64_t all = 150;
  for (const Config& config : amx)
    for (const auto& shape : {std::pair<int64_t, int64_t>{64, 320}, {72, 300}})
      for (ThreadPool* pool : {&pool1, &pool3}) {
        const KernelTable& kernels = *config.table;
        const int64_t N = shape.first, K = shape.second;
        const std::string what = config.name + " N=" + std::to_string(N) +
                                 " K=" + std::to_string(K) +
                                 " threads=" + std::to_string(pool->num_threads());
        std::vector<float> x = random_f32(rng, size_t(all * K)), b = random_f32(rng, size_t(N));
        Tensor w = random_tensor(rng, size_t(N * K), DType::bf16);
        auto run = [&](int64_t M, LinearRows rows) {
          std::vector<float> y(size_t(M * N), NAN);
          kernels.linear(x.data(), w.data(), DType::bf16, b.data(), y.data(), M, N, K, *pool, rows);
          return y;
        };
        const std::vector<float> whole = run(all, LinearRows::kAny);
        std::vector<float> want(whole.size());
        ref::linear(x.data(), w.data(), DType::bf16, b.data(), want.data(), all, N, K);
        expect_close(whole, want, nmse_tolerance(K, true), what);
        for (int64_t M : {1, 2, 4, 15, 16, 17, 31, 32, 33, 127, 128, 129})
          for (LinearRows rows : {LinearRows::kAny, LinearRows::kDecode}) {
            const std::vector<float> part = run(M, rows);
            EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin()))
                << what << " M=" << M << (rows == LinearRows::kDecode ? " decode" : "");
          }
      }
}

// quantize_int4: every value within half a step of its block's (stored) scale, except those
// clamped to code 15 (+7 steps, where values of the other sign than the largest reach up to +8:
// within a step, as in Q4_0), the value of largest magnitude at code 0 (-8 steps), an all-zero
// row at scale 0, and the same bytes on every pool (K = 300: 9 full blocks and a partial one).
TEST(Ops, QuantizeInt4RoundTrip) {
  std::mt19937 rng(98);
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t N = 16, K = 300, nb = int4_blocks(K);
    Tensor w = random_tensor(rng, size_t(N * K), dt, -3.0f, 3.0f);
    for (int64_t k = 0; k < K; ++k) {  // row 2 all zero
      w.f[size_t(2 * K + k)] = 0.0f;
      if (dt == DType::bf16) w.h[size_t(2 * K + k)] = 0;
    }
    std::vector<uint8_t> q(size_t(N / kInt4Rows * nb * kInt4TileBytes)), q3(q.size());
    std::vector<uint16_t> scale(size_t(N * nb)), scale3(scale.size());
    ThreadPool pool1(1), pool3(3);
    quantize_int4(w.data(), dt, q.data(), scale.data(), N, K, pool1);
    quantize_int4(w.data(), dt, q3.data(), scale3.data(), N, K, pool3);
    EXPECT_EQ(q, q3);
    EXPECT_EQ(scale, scale3);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < nb; ++b) {
        const float sc = f16_to_f32(scale[size_t((n / kInt4Rows * nb + b) * kInt4Rows + n % 8)]);
        float m = 0;
        for (int64_t k = b * kInt4Block; k < std::min(K, (b + 1) * kInt4Block); ++k) {
          const float v = w.f[size_t(n * K + k)];
          const int c = int4_code(q.data(), K, n, k);
          if (std::abs(v) > std::abs(m)) m = v;
          const float steps = c == 15 ? 1.0f : 0.5f;
          ASSERT_LE(std::abs(v - sc * float(c - 8)), steps * std::abs(sc) * (1 + 1e-3f) + 1e-30f)
              << dtype_name(dt) << " row " << n << " k " << k;
        }
        if (n == 2) {
          EXPECT_EQ(sc, 0.0f);
          continue;
        }
        EXPECT_NEAR(sc, m / -8.0f, std::abs(m) / 8 * 0x1p-11) << "row " << n << " block " << b;
        for (int64_t k = b * kInt4Block; k < std::min(K, (b + 1) * kInt4Block); ++k)
          if (w.f[size_t(n * K + k)] == m) {
            EXPECT_EQ(int4_code(q.data(), K, n, k), 0);
          }
      }
  }
}

// -------------------------------------------------------------------- embedding, add, cache

// The kernels' branchless f16 widening gives f16_to_f32's bits for every f16 value: zeros of
// both signs, subnormals, normals, infinities and NaNs with their payloads.
TEST(Ops, F16WideningIsExactForEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(std::bit_cast<uint32_t>(f16_as_f32(uint16_t(h))),
              std::bit_cast<uint32_t>(f16_to_f32(uint16_t(h))))
        << std::hex << h;
}

TEST(Ops, EmbeddingIsExact) {
  std::mt19937 rng(7);
  const int64_t V = 50, D = 37;
  const std::vector<int32_t> ids = {0, 49, 3, 3, 17};
  for_each_weight_config(
      [&](const KernelTable& kernels, Target, DType dt, ThreadPool& pool, const std::string& what) {
        Tensor table = random_tensor(rng, size_t(V * D), dt);
        std::vector<float> out(ids.size() * D, NAN), want(out.size());
        kernels.embedding(table.data(), dt, ids.data(), int64_t(ids.size()), D, out.data(), pool);
        ref::embedding(table.data(), dt, ids.data(), int64_t(ids.size()), D, want.data());
        EXPECT_EQ(out, want) << what;
      });
}

TEST(Ops, AddIsExactAndMayAlias) {
  std::mt19937 rng(8);
  for_each_config(
      [&](const KernelTable& kernels, Target, DType, ThreadPool& pool, const std::string& what) {
        for (int64_t n : {1, 7, 1000, 40000}) {
          std::vector<float> a = random_f32(rng, size_t(n)), b = random_f32(rng, size_t(n));
          std::vector<float> want(a.size());
          ref::add(a.data(), b.data(), want.data(), n);
          kernels.add(a.data(), b.data(), a.data(), n, pool);  // y aliases a
          EXPECT_EQ(a, want) << what << " n=" << n;
        }
      });
}

TEST(Ops, SiluMul) {
  std::mt19937 rng(9);
  for_each_config(
      [&](const KernelTable& kernels, Target, DType, ThreadPool& pool, const std::string& what) {
        for (int64_t n : {1, 13, 3072, 40000}) {
          std::vector<float> g = random_f32(rng, size_t(n), -8.0f, 8.0f),
                             u = random_f32(rng, size_t(n));
          std::vector<float> want(g.size());
          ref::silu_mul(g.data(), u.data(), want.data(), n);
          kernels.silu_mul(g.data(), u.data(), g.data(), n, pool);  // y aliases gate
          // A few roundings per element (exp, add, divide, multiply): K = 4.
          expect_close(g, want, nmse_tolerance(4), what + " n=" + std::to_string(n));
        }
      });
}

// gelu_tanh(g) * up over the range of MLP gates, and gates whose gelu saturates: g (large
// positive g), about -0 (large negative g, also where g^3 overflows f32).
TEST(Ops, GeluTanhMul) {
  std::mt19937 rng(21);
  for_each_config(
      [&](const KernelTable& kernels, Target, DType, ThreadPool& pool, const std::string& what) {
        for (int64_t n : {1, 13, 3072, 40000}) {
          std::vector<float> g = random_f32(rng, size_t(n), -8.0f, 8.0f),
                             u = random_f32(rng, size_t(n));
          const float extremes[] = {30.0f, -30.0f, 1e20f, -1e20f, 0.0f, -0.0f};
          for (size_t i = 0; i < std::size(extremes) && i < size_t(n); ++i) g[i] = extremes[i];
          std::vector<float> want(g.size());
          ref::gelu_tanh_mul(g.data(), u.data(), want.data(), n);
          kernels.gelu_tanh_mul(g.data(), u.data(), u.data(), n, pool);  // y aliases up
          // A few roundings per element (the cubic, exp, add, divide, multiply): K = 6.
          expect_close(u, want, nmse_tolerance(6), what + " n=" + std::to_string(n));
        }
      });
}

TEST(Ops, ScaleIsExact) {
  std::mt19937 rng(22);
  for_each_config(
      [&](const KernelTable& kernels, Target, DType, ThreadPool& pool, const std::string& what) {
        for (int64_t n : {1, 7, 1000, 40000}) {
          std::vector<float> x = random_f32(rng, size_t(n), -100.0f, 100.0f), want(x.size());
          const float factor = 45.254833995939045f;  // sqrt(2048), Gemma's embedding scale
          ref::scale(x.data(), factor, want.data(), n);
          kernels.scale(x.data(), factor, x.data(), n, pool);  // y aliases x
          EXPECT_EQ(x, want) << what << " n=" << n;
        }
      });
}

// Logits far inside the cap (nearly x), near it and far past it (nearly +-cap), with y apart
// from x and aliasing it.
TEST(Ops, Softcap) {
  std::mt19937 rng(23);
  for_each_config(
      [&](const KernelTable& kernels, Target, DType, ThreadPool& pool, const std::string& what) {
        for (int64_t n : {1, 13, 3000, 40000}) {
          for (float range : {1.0f, 30.0f, 1000.0f}) {
            std::vector<float> x = random_f32(rng, size_t(n), -range, range), y(x.size(), NAN),
                               want(x.size());
            ref::softcap(x.data(), 30.0f, want.data(), n);
            kernels.softcap(x.data(), 30.0f, y.data(), n, pool);
            // The division, tanh's few ulp and the product: K = 4.
            const std::string label =
                what + " n=" + std::to_string(n) + " range=" + std::to_string(range);
            expect_close(y, want, nmse_tolerance(4), label);
            kernels.softcap(x.data(), 30.0f, x.data(), n, pool);
            EXPECT_EQ(x, y) << label << " in place";
          }
        }
      });
}

TEST(Ops, CacheWriteIsExact) {
  std::mt19937 rng(10);
  struct Case {
    int64_t B, T, Hkv, S, D, start;
  };
  const Case cases[] = {{1, 1, 2, 8, 4, 5}, {2, 3, 3, 10, 5, 7}, {1, 6, 1, 6, 16, 0}};
  for_each_config([&](const KernelTable& kernels, Target, DType dt, ThreadPool& pool,
                      const std::string& what) {
    for (const auto& c : cases) {
      const size_t cache_n = size_t(c.B * c.Hkv * c.S * c.D);
      std::vector<float> src = random_f32(rng, size_t(c.B * c.T * c.Hkv * c.D));
      Tensor cache = random_tensor(rng, cache_n, dt), want = cache;
      kernels.cache_write(cache.data(), dt, src.data(), c.B, c.T, c.Hkv, c.S, c.D, c.start, pool);
      ref::cache_write(want.data(), dt, src.data(), c.B, c.T, c.Hkv, c.S, c.D, c.start);
      if (dt == DType::bf16)
        EXPECT_EQ(cache.h, want.h) << what;
      else
        EXPECT_EQ(cache.f, want.f) << what;
    }
  });
}

// ---------------------------------------------------------------------- rms_norm, rope

TEST(Ops, RmsNorm) {
  std::mt19937 rng(11);
  for_each_weight_config(
      [&](const KernelTable& kernels, Target, DType dt, ThreadPool& pool, const std::string& what) {
        for (int64_t D : {1, 7, 128, 1024, 1031})
          for (bool unit_offset : {false, true}) {
            const int64_t M = 5;
            std::vector<float> x = random_f32(rng, size_t(M * D), -3.0f, 3.0f), want(x.size());
            // Gemma's weights are offsets from 1, around 0.
            Tensor w = unit_offset ? random_tensor(rng, size_t(D), dt, -0.5f, 0.5f)
                                   : random_tensor(rng, size_t(D), dt, 0.5f, 1.5f);
            ref::rms_norm(x.data(), w.data(), dt, want.data(), M, D, 1e-6f, unit_offset);
            kernels.rms_norm(x.data(), w.data(), dt, x.data(), M, D, 1e-6f, unit_offset,
                             pool);  // y aliases x
            expect_close(
                x, want, nmse_tolerance(D),
                what + " D=" + std::to_string(D) + " unit_offset=" + std::to_string(unit_offset));
          }
      });
}

TEST(Ops, Rope) {
  std::mt19937 rng(12);
  for_each_config(
      [&](const KernelTable& kernels, Target, DType, ThreadPool& pool, const std::string& what) {
        // (head_dim, rotary_dim): whole heads, and partial rotary (GLM's half, Phi-style
        // quarters, a rotary part that is not a multiple of 8).
        const std::pair<int64_t, int64_t> dims[] = {{2, 2},    {6, 6},   {64, 64}, {128, 128},
                                                    {128, 64}, {64, 16}, {10, 6}};
        for (auto [D, R] : dims)
          for (bool interleaved : {false, true}) {
            const int64_t M = 4, H = 3;
            std::vector<int32_t> pos = {0, 1, 17, 4000};
            std::vector<float> inv_freq(size_t(R / 2));
            for (int64_t i = 0; i < R / 2; ++i)
              inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(R)));
            const std::vector<float> x0 = random_f32(rng, size_t(M * H * D));
            std::vector<float> x = x0, want = x0;
            kernels.rope(x.data(), pos.data(), inv_freq.data(), M, H, D, R, interleaved, pool);
            ref::rope(want.data(), pos.data(), inv_freq.data(), M, H, D, R, interleaved);
            // f32 cos/sin of angles up to ~4000 rad are accurate to a few ulp of the angle: K = 4.
            const std::string label = what + " D=" + std::to_string(D) + " R=" + std::to_string(R) +
                                      " interleaved=" + std::to_string(interleaved);
            expect_close(x, want, nmse_tolerance(4), label);
            for (int64_t r = 0; r < M * H; ++r)  // features past rotary_dim pass unchanged
              for (int64_t i = R; i < D; ++i)
                ASSERT_EQ(x[size_t(r * D + i)], x0[size_t(r * D + i)]) << label;
          }
      });
}

// ------------------------------------------------------------------------------ attention

struct AttnCase {
  int64_t B, T, Hq, Hkv, S, D, start;
  int mask;  // 0: none, 1: random zeros, 2: left padding that leaves some queries no key
  int64_t window = 0;
  float softcap = 0.0f;
  bool sinks = false;  // a random attention sink per query head
};

// Attention sinks for Hq query heads in [-1, 3): about the size of the scores of the attention
// tests (|q . k| * scale of order 1), so that they move both the max and the denominator.
std::vector<float> random_sinks(std::mt19937& rng, int64_t Hq) {
  return random_f32(rng, size_t(Hq), -1.0f, 3.0f);
}

TEST(Ops, Attention) {
  const AttnCase cases[] = {
      {1, 1, 4, 4, 16, 8, 5, 0},     // decode, no GQA
      {1, 1, 8, 2, 64, 64, 40, 1},   // decode, GQA 4, masked keys
      {2, 5, 4, 1, 24, 32, 3, 1},    // prefill after a prefix (start > 0), GQA 4
      {1, 7, 2, 2, 16, 16, 0, 0},    // plain prefill
      {2, 4, 4, 2, 12, 24, 0, 2},    // padded batch row: its first queries see nothing
      {2, 3, 4, 2, 40, 128, 30, 1},  // head_dim 128
      {1, 2, 2, 1, 8, 5, 1, 0},      // odd head_dim
      // Decode over key blocks from two halves of the slots, with leftover keys: GQA 2 (4 keys
      // a block) and head_dim 72 (8 columns past the 16-column steps); one query row (8 keys).
      {1, 1, 4, 2, 300, 72, 257, 0},
      {1, 1, 2, 2, 100, 48, 90, 1},
      // Sliding windows: decode (the window bounds the key range), with masked keys; prefill
      // after a prefix, GQA 4 (one query per set); prefill with 2 queries per set whose windows
      // differ; padding that leaves the first queries of row 1 no key.
      {1, 1, 8, 2, 300, 64, 257, 0, 64},
      {1, 1, 4, 2, 100, 72, 90, 1, 16},
      {2, 9, 4, 1, 40, 32, 5, 1, 4},
      {1, 12, 2, 2, 16, 16, 0, 0, 3},
      {2, 4, 4, 2, 12, 24, 0, 2, 2},
      // Soft-capped scores (typical |scores| about 0.7 here, so caps of 0.5-2 bend them), alone
      // and with a window.
      {1, 1, 8, 2, 64, 64, 40, 1, 0, 0.5f},
      {2, 5, 4, 1, 24, 32, 3, 0, 0, 2.0f},
      {1, 7, 4, 2, 40, 128, 20, 1, 8, 1.0f},
      // The x86 targets' blocked prefill (from 32 query rows per KV head): several units per
      // head, more slots than one GEMM k block (256) and head_dim 72 (a partial panel of value
      // columns), after a prefix with masked keys; then windows, left padding and a soft cap.
      {1, 300, 4, 2, 400, 72, 30, 1},
      {2, 70, 2, 1, 128, 40, 0, 2, 48, 1.5f},
      // Attention sinks: decode with GQA and masked keys; prefill after a prefix with a window
      // and a soft cap; padding that leaves the first queries of row 1 no key; the blocked
      // prefill, alone and with a window, left padding and a soft cap.
      {1, 1, 8, 2, 64, 64, 40, 1, 0, 0.0f, true},
      {2, 9, 4, 1, 40, 32, 5, 1, 4, 1.0f, true},
      {2, 4, 4, 2, 12, 24, 0, 2, 0, 0.0f, true},
      {1, 300, 4, 2, 400, 72, 30, 1, 0, 0.0f, true},
      {2, 70, 2, 1, 128, 40, 0, 2, 48, 1.5f, true},
  };
  std::mt19937 rng(13);
  for_each_config<true>([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                            const std::string& what) {
    for (const auto& c : cases) {
      const size_t cache_n = size_t(c.B * c.Hkv * c.S * c.D);
      std::vector<float> q = random_f32(rng, size_t(c.B * c.T * c.Hq * c.D), -2.0f, 2.0f);
      Tensor k = random_tensor(rng, cache_n, dt), v = random_tensor(rng, cache_n, dt);
      // Slots at or past start + T, and those before every query's window, must never be
      // read: poison them.
      const int64_t first = c.window ? std::max<int64_t>(0, c.start + 1 - c.window) : 0;
      for (int64_t bh = 0; bh < c.B * c.Hkv; ++bh)
        for (int64_t s = 0; s < c.S; ++s) {
          if (s >= first && s < c.start + c.T) continue;
          for (int64_t i = 0; i < c.D; ++i) {
            const size_t at = size_t((bh * c.S + s) * c.D + i);
            if (dt == DType::bf16) {
              k.h[at] = v.h[at] = 0x7fc0;  // NaN
            } else {
              k.f[at] = v.f[at] = NAN;
            }
          }
        }
      std::vector<int32_t> mask(size_t(c.B * c.S), 1);
      if (c.mask == 1)
        for (auto& m : mask) m = (rng() % 4 == 0) ? 0 : 1;
      if (c.mask == 2)
        for (int64_t s = 0; s < 2; ++s) mask[size_t(1 * c.S + s)] = 0;  // row 1: 2 pad slots
      // Masked slots' rows may hold anything: poison them. Their value rows must never be
      // read; their key rows may be, as long as no score of theirs reaches the output.
      for (int64_t b = 0; c.mask && b < c.B; ++b)
        for (int64_t s = 0; s < c.S; ++s)
          if (mask[size_t(b * c.S + s)] == 0)
            for (int64_t h = 0; h < c.Hkv; ++h)
              for (int64_t i = 0; i < c.D; ++i) {
                const size_t at = size_t(((b * c.Hkv + h) * c.S + s) * c.D + i);
                if (dt == DType::bf16) {
                  k.h[at] = v.h[at] = 0x7fc0;  // NaN
                } else {
                  k.f[at] = v.f[at] = NAN;
                }
              }
      const int32_t* key_mask = c.mask ? mask.data() : nullptr;
      const float scale = 1.0f / std::sqrt(float(c.D));
      // Drawn only for the sinks' cases: the other cases keep their draws.
      const std::vector<float> sink_values =
          c.sinks ? random_sinks(rng, c.Hq) : std::vector<float>{};
      const float* sinks = c.sinks ? sink_values.data() : nullptr;
      std::vector<float> out(q.size(), NAN), want(q.size());
      kernels.attention(q.data(), k.data(), v.data(), dt, key_mask, out.data(), c.B, c.T, c.Hq,
                        c.Hkv, c.S, c.D, c.start, scale, c.window, c.softcap, sinks, nullptr,
                        nullptr, pool);
      ref::attention(q.data(), k.data(), v.data(), dt, key_mask, want.data(), c.B, c.T, c.Hq, c.Hkv,
                     c.S, c.D, c.start, scale, c.window, c.softcap, sinks);
      // Scores are D-term dot products; the output is a weighted sum over up to start + T keys
      // and a few roundings in exp and the normalization (and the soft cap's division, tanh
      // and product). The AVX-512 BF16 target's blocked prefill (from 32 query rows per KV
      // head, kAttnMinRows of kernels_x86.h) over a bf16 cache rounds q and the
      // probabilities to bf16, as its linears round their inputs.
      const bool bf16_products =
          t >= Target::kAVX512BF16 && dt == DType::bf16 && c.T * (c.Hq / c.Hkv) >= 32;
      const std::string name = what + (c.sinks ? " sinks" : "");
      expect_close(
          out, want, nmse_tolerance(c.D + c.start + c.T + (c.softcap ? 8 : 4), bf16_products),
          name + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
              " Hq=" + std::to_string(c.Hq) + " Hkv=" + std::to_string(c.Hkv) +
              " D=" + std::to_string(c.D) + " start=" + std::to_string(c.start) +
              " window=" + std::to_string(c.window) + " softcap=" + std::to_string(c.softcap));
      if (c.mask == 2) {
        // Row 1, t = 0 and 1 sit at slots 0 and 1, both padding: zeros by contract.
        for (int64_t t = 0; t < 2; ++t)
          for (int64_t i = 0; i < c.Hq * c.D; ++i)
            EXPECT_EQ(out[size_t(((1 * c.T + t) * c.Hq) * c.D + i)], 0.0f) << what;
      }
    }
  });
}

// ------------------------------------------------------------------------- paged KV cache

// A pool of `blocks` blocks and each row's table: its blocks in a shuffled order, so that a
// sequence's positions are never laid out contiguously.
struct Paged {
  int64_t NB, BS, MB;
  std::vector<int32_t> table;  // (B, MB)
};
Paged shuffled_tables(std::mt19937& rng, int64_t B, int64_t BS, int64_t MB) {
  Paged p{B * MB + 3, BS, MB, {}};  // 3 blocks nobody owns
  std::vector<int32_t> ids(size_t(p.NB));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.table.assign(ids.begin(), ids.begin() + B * MB);
  return p;
}

TEST(Ops, PagedCacheWriteIsExact) {
  std::mt19937 rng(21);
  // Rows at different positions, one padding token (-1), writes that cross a block boundary.
  const int64_t B = 3, T = 3, Hkv = 2, BS = 4, MB = 3, D = 8;
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, -1, 9, 10};
  // One implementation for every target (no vector code): each dtype and pool size.
  for_each_config(
      [&](const KernelTable&, Target, DType dt, ThreadPool& pool, const std::string& what) {
        Paged p = shuffled_tables(rng, B, BS, MB);
        std::vector<float> src = random_f32(rng, size_t(B * T * Hkv * D));
        Tensor cache = random_tensor(rng, size_t(p.NB * Hkv * BS * D), dt), want = cache;
        paged_cache_write(cache.data(), dt, src.data(), p.table.data(), nullptr, pos.data(), B, T,
                          Hkv, BS, MB, D, pool);
        ref::paged_cache_write(want.data(), dt, src.data(), p.table.data(), nullptr, pos.data(), B,
                               T, Hkv, BS, MB, D);
        if (dt == DType::bf16)
          EXPECT_EQ(cache.h, want.h) << what;
        else
          EXPECT_EQ(cache.f, want.f) << what;
      });
}

// Paged attention against the reference, and bit for bit against the static-cache kernel over
// the same keys laid out contiguously: a sequence's numbers must not depend on where its blocks
// are or on the other rows of the batch.
TEST(Ops, PagedAttention) {
  struct Case {
    int64_t B, T, Hq, Hkv, BS, MB, D;
    std::vector<int32_t> pos;  // (B,T)
    int64_t window = 0;
    float softcap = 0.0f;
    bool sinks = false;
  };
  const Case cases[] = {
      {3, 1, 4, 2, 4, 5, 16, {0, 7, 19}},             // decode rows at different lengths
      {2, 1, 8, 2, 16, 3, 64, {40, -1}},              // a padding row
      {1, 6, 4, 1, 4, 3, 32, {-1, -1, 0, 1, 2, 3}},   // left-padded prefill, GQA 4
      {2, 3, 2, 2, 8, 4, 24, {5, 6, 7, 20, 21, 22}},  // chunks after a prefix
      {2, 1, 4, 2, 4, 8, 72, {30, 9}, 6},             // sliding window
      {1, 4, 4, 2, 4, 4, 40, {3, 4, 5, 6}, 3, 1.0f},  // window and soft cap
      // The x86 targets' blocked prefill (80 query rows of one KV head), padding at the end.
      {1, 20, 4, 1, 8, 4, 24, {5,  6,  7,  8,  9,  10, 11, 12, 13, 14,
                               15, 16, 17, 18, 19, 20, 21, 22, -1, -1}},
      // Attention sinks: decode rows and a padding row (the row-set kernel); with positions
      // several tokens take the x86 targets' blocked kernel: left-padded prefill with GQA 4, a
      // window and a soft cap, two rows with padding at the end.
      {3, 1, 8, 2, 4, 5, 16, {0, 7, -1}, 0, 0.0f, true},
      {1, 6, 4, 1, 4, 3, 32, {-1, -1, 0, 1, 2, 3}, 0, 0.0f, true},
      {1, 4, 4, 2, 4, 4, 40, {3, 4, 5, 6}, 3, 1.0f, true},
      {2, 6, 8, 2, 8, 4, 24, {9, 10, 11, 12, -1, -1, 0, 1, 2, 3, 4, -1}, 0, 0.0f, true},
  };
  std::mt19937 rng(22);
  for_each_config<true>([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                            const std::string& what) {
    for (const auto& c : cases) {
      Paged p = shuffled_tables(rng, c.B, c.BS, c.MB);
      const size_t pool_n = size_t(p.NB * c.Hkv * c.BS * c.D);
      Tensor k = random_tensor(rng, pool_n, dt), v = random_tensor(rng, pool_n, dt);
      std::vector<float> q = random_f32(rng, size_t(c.B * c.T * c.Hq * c.D), -2.0f, 2.0f);
      const float scale = 1.0f / std::sqrt(float(c.D));
      const std::vector<float> sink_values =
          c.sinks ? random_sinks(rng, c.Hq) : std::vector<float>{};
      const float* sinks = c.sinks ? sink_values.data() : nullptr;
      std::vector<float> out(q.size(), NAN), want(q.size());
      paged_attention_with(kernels, q.data(), k.data(), v.data(), dt, p.table.data(), nullptr,
                           c.pos.data(), out.data(), c.B, c.T, c.Hq, c.Hkv, c.BS, c.MB, c.D, scale,
                           c.window, c.softcap, sinks, pool);
      ref::paged_attention(q.data(), k.data(), v.data(), dt, p.table.data(), nullptr, c.pos.data(),
                           want.data(), c.B, c.T, c.Hq, c.Hkv, c.BS, c.MB, c.D, scale, c.window,
                           c.softcap, sinks);
      const std::string name = what + (c.sinks ? " sinks" : "");
      const std::string label = name + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                                " D=" + std::to_string(c.D) + " window=" + std::to_string(c.window);
      // As in Ops.Attention: AVX-512 BF16's blocked prefill over bf16 rounds q and p to bf16; with
      // positions it takes that path for every call of several tokens.
      const bool bf16_products = t >= Target::kAVX512BF16 && dt == DType::bf16 && c.T > 1;
      expect_close(out, want, nmse_tolerance(c.D + c.MB * c.BS + 8, bf16_products), label);
      // Each row alone, its blocks unpaged into a static cache (1,Hkv,S,D): the same bits.
      const int64_t S = c.MB * c.BS, elem = int64_t(dtype_size(dt));
      for (int64_t b = 0; b < c.B; ++b) {
        std::vector<char> ks(size_t(c.Hkv * S * c.D * elem)), vs(ks.size());
        for (int64_t h = 0; h < c.Hkv; ++h)
          for (int64_t j = 0; j < S; ++j) {
            const int64_t src =
                ((int64_t(p.table[size_t(b * c.MB + j / c.BS)]) * c.Hkv + h) * c.BS + j % c.BS) *
                c.D * elem;
            const int64_t dst = (h * S + j) * c.D * elem;
            std::memcpy(ks.data() + dst, static_cast<const char*>(k.data()) + src,
                        size_t(c.D * elem));
            std::memcpy(vs.data() + dst, static_cast<const char*>(v.data()) + src,
                        size_t(c.D * elem));
          }
        const int64_t row = b * c.T * c.Hq * c.D;
        std::vector<float> alone(size_t(c.T * c.Hq * c.D), NAN);
        kernels.attention(q.data() + row, ks.data(), vs.data(), dt, nullptr, alone.data(), 1, c.T,
                          c.Hq, c.Hkv, S, c.D, 0, scale, c.window, c.softcap, sinks,
                          c.pos.data() + b * c.T, nullptr, pool);
        for (size_t i = 0; i < alone.size(); ++i)
          ASSERT_EQ(alone[i], out[size_t(row) + i]) << label << " row " << b << " at " << i;
      }
    }
  });
}

// Several sequences' tokens packed into one row (the serving engine's packed prefill steps):
// each token names its sequence's table row, the sequences' tokens are interleaved out of order
// with padding between them, and each must get the bits it gets in a row of its own, its tokens in
// order and left-padded to another length (the step it would run in alone); against the
// reference too, without and with attention sinks. The cache write of such a row lands where the
// per-row writes land.
TEST(Ops, PagedAttentionPacksSequences) {
  struct Seq {
    int64_t start, n;  // positions [start, start + n) are new; [0, start) are in the pool
  };
  const Seq seqs[] = {{0, 7}, {13, 1}, {5, 20}, {30, 3}};
  const int64_t Hq = 4, Hkv = 2, BS = 4, MB = 9, D = 24, S = int64_t(std::size(seqs));
  std::mt19937 rng(23), sink_rng(24);
  for_each_config<true>([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                            const std::string& what) {
    Paged p = shuffled_tables(rng, S, BS, MB);
    const size_t pool_n = size_t(p.NB * Hkv * BS * D);
    Tensor k = random_tensor(rng, pool_n, dt), v = random_tensor(rng, pool_n, dt);
    // The packed row: every token of every sequence, shuffled, with 5 padding tokens.
    std::vector<std::pair<int64_t, int64_t>> order;  // (sequence, token) or (-1, -1)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < seqs[s].n; ++i) order.push_back({s, i});
    for (int i = 0; i < 5; ++i) order.push_back({-1, -1});
    std::shuffle(order.begin(), order.end(), rng);
    const int64_t T = int64_t(order.size());
    std::vector<int32_t> pos(static_cast<size_t>(T)), rows(static_cast<size_t>(T));
    std::vector<float> q(size_t(T * Hq * D), 0.0f);
    std::vector<std::vector<float>> q_seq(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) q_seq[size_t(s)] = random_f32(rng, size_t(seqs[s].n * Hq * D));
    for (int64_t i = 0; i < T; ++i) {
      const auto [s, tok] = order[size_t(i)];
      pos[size_t(i)] = s < 0 ? -1 : int32_t(seqs[s].start + tok);
      rows[size_t(i)] = s < 0 ? int32_t(rng() % S) : int32_t(s);  // padding's row is unread
      if (s >= 0)
        std::copy_n(q_seq[size_t(s)].begin() + tok * Hq * D, Hq * D, q.begin() + i * Hq * D);
    }
    const float scale = 1.0f / std::sqrt(float(D));
    // Without sinks and with them (drawn apart, so that the other draws stay as they were).
    const std::vector<float> sink_values = random_sinks(sink_rng, Hq);
    for (const float* sinks : {static_cast<const float*>(nullptr), sink_values.data()}) {
      const std::string w = what + (sinks ? " sinks" : "");
      std::vector<float> out(q.size(), NAN), want(q.size());
      paged_attention_with(kernels, q.data(), k.data(), v.data(), dt, p.table.data(), rows.data(),
                           pos.data(), out.data(), 1, T, Hq, Hkv, BS, MB, D, scale, 0, 0.0f, sinks,
                           pool);
      ref::paged_attention(q.data(), k.data(), v.data(), dt, p.table.data(), rows.data(),
                           pos.data(), want.data(), 1, T, Hq, Hkv, BS, MB, D, scale, 0, 0.0f,
                           sinks);
      const bool bf16_products = t >= Target::kAVX512BF16 && dt == DType::bf16;
      expect_close(out, want, nmse_tolerance(D + MB * BS + 8, bf16_products), w + " packed");
      for (int64_t s = 0; s < S; ++s) {
        // Alone: its tokens in order, right-aligned in a row of n + 3, with its own table row.
        const int64_t n = seqs[s].n, Ta = n + 3;
        std::vector<int32_t> apos(size_t(Ta), -1);
        std::vector<float> aq(size_t(Ta * Hq * D), 0.0f), aout(aq.size(), NAN);
        for (int64_t i = 0; i < n; ++i) apos[size_t(3 + i)] = int32_t(seqs[s].start + i);
        std::copy(q_seq[size_t(s)].begin(), q_seq[size_t(s)].end(), aq.begin() + 3 * Hq * D);
        paged_attention_with(kernels, aq.data(), k.data(), v.data(), dt, p.table.data() + s * MB,
                             nullptr, apos.data(), aout.data(), 1, Ta, Hq, Hkv, BS, MB, D, scale, 0,
                             0.0f, sinks, pool);
        for (int64_t i = 0; i < T; ++i) {
          if (order[size_t(i)].first != s) continue;
          const int64_t tok = order[size_t(i)].second;
          for (int64_t j = 0; j < Hq * D; ++j)
            ASSERT_EQ(out[size_t(i * Hq * D + j)], aout[size_t((3 + tok) * Hq * D + j)])
                << w << " sequence " << s << " token " << tok << " at " << j;
        }
      }
      for (int64_t i = 0; i < T; ++i) {
        if (pos[size_t(i)] >= 0) continue;
        for (int64_t j = 0; j < Hq * D; ++j) ASSERT_EQ(out[size_t(i * Hq * D + j)], 0.0f) << w;
      }
    }
    // The packed cache write against the reference's.
    std::vector<float> src = random_f32(rng, size_t(T * Hkv * D));
    Tensor cache = random_tensor(rng, pool_n, dt), expect = cache;
    paged_cache_write(cache.data(), dt, src.data(), p.table.data(), rows.data(), pos.data(), 1, T,
                      Hkv, BS, MB, D, pool);
    ref::paged_cache_write(expect.data(), dt, src.data(), p.table.data(), rows.data(), pos.data(),
                           1, T, Hkv, BS, MB, D);
    if (dt == DType::bf16)
      EXPECT_EQ(cache.h, expect.h) << what;
    else
      EXPECT_EQ(cache.f, expect.f) << what;
  });
}

// A prompt's queries give the same bits in one call or cut into chunks (a prefix hit's remainder,
// a chunked prompt), with a sliding window too: the call's earliest window start then moves with
// the cut, and each row's probabilities must still sum in the same lanes, and its product with the
// values in the same blocks of slots (the long prompt: windows that start past the GEMM's first
// block of 256 slots). Against the reference within tolerance, and bit for bit between the cuts.
// Head size 40: two 16-column steps and a tail, so that on the scalar target (whose prefill is the
// row-set kernel) a query row scored in a set of 4 rows and in a set of 2 sums in the same order.
TEST(Ops, PagedAttentionChunksGiveTheWholeCallsBitsWithAWindow) {
  struct Case {
    int64_t T;
    std::vector<int64_t> windows;
    std::vector<std::pair<int64_t, int64_t>> cuts;
  };
  const Case cases[] = {{40, {0, 11, 17}, {{13, 40}, {21, 40}, {37, 40}, {5, 19}, {30, 34}}},
                        {560, {300}, {{301, 560}, {333, 560}, {517, 530}}}};
  const int64_t Hq = 4, Hkv = 2, BS = 4, D = 40;
  std::mt19937 rng(29);
  for (const Case& c : cases) {
    const int64_t T = c.T, MB = T / BS;
    for_each_config<true>([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                              const std::string& what) {
      Paged p = shuffled_tables(rng, 1, BS, MB);
      const size_t pool_n = size_t(p.NB * Hkv * BS * D);
      Tensor k = random_tensor(rng, pool_n, dt), v = random_tensor(rng, pool_n, dt);
      const std::vector<float> q = random_f32(rng, size_t(T * Hq * D));
      const float scale = 1.0f / std::sqrt(float(D));
      for (int64_t window : c.windows) {
        const std::string w =
            what + " T " + std::to_string(T) + " window " + std::to_string(window);
        auto run = [&](int64_t t0, int64_t t1) {  // queries [t0, t1) in one call
          std::vector<int32_t> pos(size_t(t1 - t0));
          std::iota(pos.begin(), pos.end(), int32_t(t0));
          std::vector<float> out(size_t((t1 - t0) * Hq * D), NAN);
          paged_attention_with(kernels, q.data() + t0 * Hq * D, k.data(), v.data(), dt,
                               p.table.data(), nullptr, pos.data(), out.data(), 1, t1 - t0, Hq, Hkv,
                               BS, MB, D, scale, window, 0.0f, nullptr, pool);
          return out;
        };
        const std::vector<float> whole = run(0, T);
        std::vector<int32_t> pos(static_cast<size_t>(T));
        std::iota(pos.begin(), pos.end(), 0);
        std::vector<float> want(whole.size());
        ref::paged_attention(q.data(), k.data(), v.data(), dt, p.table.data(), nullptr, pos.data(),
                             want.data(), 1, T, Hq, Hkv, BS, MB, D, scale, window, 0.0f);
        const bool bf16_products = t >= Target::kAVX512BF16 && dt == DType::bf16;
        expect_close(whole, want, nmse_tolerance(D + T + 8, bf16_products), w);
        for (const auto& [t0, t1] : c.cuts) {
          const std::vector<float> part = run(t0, t1);
          for (size_t j = 0; j < part.size(); ++j)
            ASSERT_EQ(part[j], whole[size_t(t0 * Hq * D) + j])
                << w << " queries [" << t0 << ", " << t1 << ") at " << j;
        }
      }
    });
  }
}

// ------------------------------------------------------------------- attention sinks (gpt-oss)

// One query row by gpt-oss's formula in double, written apart from the reference: the scores
// s_j = q . k_j * scale (soft-capped when softcap > 0) of the key rows it sees, m = max(max_j s_j,
// sink), p_j = exp(s_j - m) / (sum_j exp(s_j - m) + exp(sink - m)), out = sum_j p_j v_j; zeros
// for a row that sees no key.
std::vector<double> sink_formula(const float* q, const std::vector<const float*>& keys,
                                 const std::vector<const float*>& values, int64_t D, double scale,
                                 double softcap, double sink) {
  std::vector<double> out(static_cast<size_t>(D), 0.0), s(keys.size());
  if (keys.empty()) return out;
  double m = sink;
  for (size_t j = 0; j < keys.size(); ++j) {
    double dot = 0.0;
    for (int64_t i = 0; i < D; ++i) dot += double(q[i]) * double(keys[j][i]);
    s[j] = dot * scale;
    if (softcap > 0) s[j] = std::tanh(s[j] / softcap) * softcap;
    m = std::max(m, s[j]);
  }
  double denominator = std::exp(sink - m);
  for (double sj : s) denominator += std::exp(sj - m);
  for (size_t j = 0; j < keys.size(); ++j)
    for (int64_t i = 0; i < D; ++i)
      out[size_t(i)] += std::exp(s[j] - m) / denominator * double(values[j][i]);
  return out;
}

// Every element of got within 1e-6 of the formula's (outputs are at most 1: values in [-1, 1]).
void expect_formula(const float* got, const std::vector<double>& want, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6) << what << " at " << i;
}

// The static-cache reference with sinks against the formula: GQA, a window, a soft cap, both,
// and a key mask that leaves row 1's first queries no key (zeros, sinks or not).
TEST(Reference, AttentionSinksFollowTheFormula) {
  struct Case {
    int64_t B, T, Hq, Hkv, S, D, start, window;
    float softcap;
    bool mask;
  };
  const Case cases[] = {{2, 3, 4, 4, 12, 8, 4, 0, 0.0f, false},
                        {1, 5, 6, 2, 16, 8, 3, 0, 0.0f, false},
                        {2, 6, 4, 2, 16, 8, 2, 3, 0.0f, false},
                        {1, 4, 4, 1, 10, 8, 5, 0, 1.5f, false},
                        {2, 5, 6, 3, 12, 8, 1, 4, 0.8f, true}};
  std::mt19937 rng(51);
  for (const Case& c : cases) {
    const std::string what = "T=" + std::to_string(c.T) + " Hq=" + std::to_string(c.Hq) +
                             " Hkv=" + std::to_string(c.Hkv) +
                             " window=" + std::to_string(c.window) +
                             " softcap=" + std::to_string(c.softcap);
    const size_t cache_n = size_t(c.B * c.Hkv * c.S * c.D);
    const std::vector<float> q = random_f32(rng, size_t(c.B * c.T * c.Hq * c.D), -2.0f, 2.0f);
    const std::vector<float> k = random_f32(rng, cache_n), v = random_f32(rng, cache_n);
    const std::vector<float> sinks = random_sinks(rng, c.Hq);
    std::vector<int32_t> mask(size_t(c.B * c.S), 1);
    if (c.mask)
      for (int64_t j = 0; j < c.S; ++j) {
        mask[size_t(j)] = int32_t(j % 2);       // row 0: every other slot
        mask[size_t(c.S + j)] = j < 3 ? 0 : 1;  // row 1: its first 3 slots are padding
      }
    const float scale = 1.0f / std::sqrt(float(c.D));
    std::vector<float> out(q.size(), NAN);
    ref::attention(q.data(), k.data(), v.data(), DType::f32, c.mask ? mask.data() : nullptr,
                   out.data(), c.B, c.T, c.Hq, c.Hkv, c.S, c.D, c.start, scale, c.window, c.softcap,
                   sinks.data());
    const int64_t group = c.Hq / c.Hkv;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t h = 0; h < c.Hq; ++h) {
          const int64_t p = c.start + t, row = ((b * c.T + t) * c.Hq + h) * c.D;
          std::vector<const float*> keys, values;
          for (int64_t j = 0; j <= p; ++j) {
            if ((c.window > 0 && j <= p - c.window) || mask[size_t(b * c.S + j)] == 0) continue;
            const int64_t at = ((b * c.Hkv + h / group) * c.S + j) * c.D;
            keys.push_back(k.data() + at);
            values.push_back(v.data() + at);
          }
          expect_formula(
              out.data() + row,
              sink_formula(q.data() + row, keys, values, c.D, scale, c.softcap, sinks[size_t(h)]),
              what + " b=" + std::to_string(b) + " t=" + std::to_string(t));
        }
  }
}

// The paged reference with sinks against the formula, several sequences packed into a row (the
// rows operand) in shuffled blocks with padding between them, with and without a window and a
// soft cap.
TEST(Reference, PagedAttentionSinksFollowTheFormula) {
  const int64_t Hq = 6, Hkv = 2, BS = 4, MB = 4, D = 8, seqs = 3;
  // Token i of the row: its sequence and position (-1: padding).
  const std::vector<int32_t> rows = {0, 2, 1, 0, 2, 1, 2, 0, 1};
  const std::vector<int32_t> pos = {3, 10, 0, 4, 11, -1, 12, 5, 1};
  const int64_t T = int64_t(pos.size());
  std::mt19937 rng(52);
  const Paged p = shuffled_tables(rng, seqs, BS, MB);
  const size_t pool_n = size_t(p.NB * Hkv * BS * D);
  const std::vector<float> k = random_f32(rng, pool_n), v = random_f32(rng, pool_n);
  const std::vector<float> q = random_f32(rng, size_t(T * Hq * D), -2.0f, 2.0f);
  const std::vector<float> sinks = random_sinks(rng, Hq);
  const float scale = 1.0f / std::sqrt(float(D));
  for (const auto& [window, softcap] : {std::pair<int64_t, float>{0, 0.0f}, {3, 1.2f}}) {
    const std::string what = "window=" + std::to_string(window);
    std::vector<float> out(q.size(), NAN);
    ref::paged_attention(q.data(), k.data(), v.data(), DType::f32, p.table.data(), rows.data(),
                         pos.data(), out.data(), 1, T, Hq, Hkv, BS, MB, D, scale, window, softcap,
                         sinks.data());
    for (int64_t i = 0; i < T; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        std::vector<const float*> keys, values;
        const int64_t first = window > 0 ? std::max<int64_t>(0, pos[size_t(i)] + 1 - window) : 0;
        for (int64_t j = first; j <= pos[size_t(i)]; ++j) {
          const int64_t block = p.table[size_t(rows[size_t(i)] * MB + j / BS)];
          const int64_t at = ((block * Hkv + h / (Hq / Hkv)) * BS + j % BS) * D;
          keys.push_back(k.data() + at);
          values.push_back(v.data() + at);
        }
        const int64_t row = (i * Hq + h) * D;
        expect_formula(
            out.data() + row,
            sink_formula(q.data() + row, keys, values, D, scale, softcap, sinks[size_t(h)]),
            what + " token " + std::to_string(i) + " head " + std::to_string(h));
      }
  }
}

// On every target: a sink far above every score takes nearly all of each softmax, so the output
// is nearly zero (and still the reference's, relatively); a query that sees no key gets exact
// zeros with sinks too (a masked-out row, a padding token). Decode, the row-set prefill and the
// x86 targets' blocked prefill (160 query rows of one KV head), static and paged.
TEST(Ops, AttentionSinksDominateAndEmptyRowsGiveZeros) {
  const int64_t B = 2, Hq = 4, Hkv = 1, S = 48, D = 24;
  std::mt19937 rng(53);
  for_each_config<true>([&](const KernelTable& kernels, Target t, DType dt, ThreadPool& pool,
                            const std::string& what) {
    const size_t cache_n = size_t(B * Hkv * S * D);
    const Tensor k = random_tensor(rng, cache_n, dt), v = random_tensor(rng, cache_n, dt);
    std::vector<int32_t> mask(size_t(B * S), 1);
    std::fill(mask.begin() + S, mask.end(), 0);  // row 1 sees no key
    for (int64_t T : {1, 5, 40}) {
      const std::string w = what + " T=" + std::to_string(T);
      const std::vector<float> q = random_f32(rng, size_t(B * T * Hq * D), -2.0f, 2.0f);
      const int64_t start = S - T;
      const float scale = 1.0f / std::sqrt(float(D));
      for (float sink : {40.0f, 0.5f}) {
        const std::vector<float> sinks(size_t(Hq), sink);
        std::vector<float> out(q.size(), NAN), want(q.size(), NAN);
        kernels.attention(q.data(), k.data(), v.data(), dt, mask.data(), out.data(), B, T, Hq, Hkv,
                          S, D, start, scale, 0, 0.0f, sinks.data(), nullptr, nullptr, pool);
        ref::attention(q.data(), k.data(), v.data(), dt, mask.data(), want.data(), B, T, Hq, Hkv, S,
                       D, start, scale, 0, 0.0f, sinks.data());
        const size_t row0 = size_t(T * Hq * D);  // row 0's outputs, then row 1's
        for (size_t i = row0; i < out.size(); ++i) {
          ASSERT_EQ(out[i], 0.0f) << w << " no key, at " << i;
          ASSERT_EQ(want[i], 0.0f) << w << " no key, reference, at " << i;
        }
        // The scores are at most a few units: exp(s - 40) < 1e-15 of each value.
        if (sink > 1.0f) {
          for (size_t i = 0; i < row0; ++i) ASSERT_LT(std::abs(out[i]), 1e-12f) << w << " at " << i;
        }
        const std::vector<float> got(out.begin(), out.begin() + int64_t(row0));
        const std::vector<float> ref(want.begin(), want.begin() + int64_t(row0));
        // As in Ops.Attention: the blocked prefill from 32 query rows per KV head.
        const bool bf16_products =
            t >= Target::kAVX512BF16 && dt == DType::bf16 && T * (Hq / Hkv) >= 32;
        expect_close(got, ref, nmse_tolerance(D + S + 8, bf16_products),
                     w + " sink=" + std::to_string(sink));
      }
    }
    // Paged: a dominant sink, and padding tokens (no key) that get zeros.
    Paged p = shuffled_tables(rng, 1, 8, 6);
    const size_t pool_n = size_t(p.NB * Hkv * 8 * D);
    const Tensor kp = random_tensor(rng, pool_n, dt), vp = random_tensor(rng, pool_n, dt);
    const std::vector<int32_t> pos = {-1, 20, 21, 22, -1};
    const std::vector<float> q = random_f32(rng, size_t(5 * Hq * D), -2.0f, 2.0f);
    const std::vector<float> sinks(size_t(Hq), 40.0f);
    std::vector<float> out(q.size(), NAN);
    paged_attention_with(kernels, q.data(), kp.data(), vp.data(), dt, p.table.data(), nullptr,
                         pos.data(), out.data(), 1, 5, Hq, Hkv, 8, 6, D, 0.2f, 0, 0.0f,
                         sinks.data(), pool);
    for (size_t i = 0; i < out.size(); ++i) {
      const bool padding = pos[i / size_t(Hq * D)] < 0;
      if (padding) {
        ASSERT_EQ(out[i], 0.0f) << what << " paged padding at " << i;
      } else {
        ASSERT_LT(std::abs(out[i]), 1e-12f) << what << " paged at " << i;
      }
    }
  });
}

// The vector exp of attention's probabilities against std::exp: within 2^-21 relative (a few
// ulp) over the range attention uses (scores minus their max, so <= 0) and above it, exactly 0
// below -87 (a masked or causal-excluded slot, -inf, must weigh exactly nothing), and
// exp(0) = 1 exactly (the largest score of every row). This file compiles it for the baseline
// target; each target's own build of it is checked through Ops.Attention.
TEST(Ops, ExpF32x8) {
  float worst = 0.0f;
  for (float x0 = -87.0f; x0 < 88.0f; x0 += 0.37f) {
    f32x8 x;
    for (int i = 0; i < kF32x8; ++i) x[i] = x0 + 0.041f * float(i);
    const f32x8 e = exp_f32x8(x);
    for (int i = 0; i < kF32x8; ++i) {
      if (x[i] >= 88.0f) continue;
      const double want = std::exp(double(x[i]));
      worst = std::max(worst, float(std::abs(e[i] - want) / want));
    }
  }
  EXPECT_LT(worst, 0x1p-21f);
  const f32x8 edge = {0.0f, -87.5f, -100.0f, -INFINITY, -1e30f, -0.0f, 1.0f, -1.0f};
  const f32x8 e = exp_f32x8(edge);
  EXPECT_EQ(e[0], 1.0f);
  EXPECT_EQ(e[1], 0.0f);
  EXPECT_EQ(e[2], 0.0f);
  EXPECT_EQ(e[3], 0.0f);
  EXPECT_EQ(e[4], 0.0f);
  EXPECT_EQ(e[5], 1.0f);
  EXPECT_NEAR(e[6], std::exp(1.0f), 4e-7f);
  EXPECT_NEAR(e[7], std::exp(-1.0f), 1e-7f);
}

// The vector tanh of softcap against std::tanh: within 2^-21 relative over both of its forms
// (the polynomial up to |x| = 0.625, exp above) and at their seam, odd, x itself for tiny x,
// exactly +-1 far out (a soft-capped score never exceeds the cap).
TEST(Ops, TanhF32x8) {
  float worst = 0.0f;
  for (float x0 = -20.0f; x0 < 20.0f; x0 += 0.013f) {
    f32x8 x;
    for (int i = 0; i < kF32x8; ++i) x[i] = x0 + 0.0017f * float(i);
    const f32x8 t = tanh_f32x8(x);
    for (int i = 0; i < kF32x8; ++i) {
      if (x[i] == 0.0f) continue;
      const double want = std::tanh(double(x[i]));
      worst = std::max(worst, float(std::abs(t[i] - want) / std::abs(want)));
    }
  }
  EXPECT_LT(worst, 0x1p-21f);
  const f32x8 edge = {0.625f, -0.625f, 0.62500006f, 1e-30f, -0.0f, 50.0f, -1e30f, INFINITY};
  const f32x8 t = tanh_f32x8(edge);
  EXPECT_NEAR(t[0], std::tanh(0.625), 2e-7);
  EXPECT_EQ(t[1], -t[0]);
  EXPECT_NEAR(t[2], std::tanh(0.62500006), 2e-7);
  EXPECT_EQ(t[3], 1e-30f);
  EXPECT_EQ(t[4], 0.0f);
  EXPECT_EQ(t[5], 1.0f);
  EXPECT_EQ(t[6], -1.0f);
  EXPECT_EQ(t[7], 1.0f);
}

// ----------------------------------------------------------- the references, by hand

TEST(Reference, LinearSmall) {
  const float x[] = {1, 2};
  const float w[] = {1, 0, 0, 1, 1, 1};  // (3, 2)
  const float b[] = {0.5f, -1, 0};
  float y[3];
  ref::linear(x, w, DType::f32, b, y, 1, 3, 2);
  EXPECT_FLOAT_EQ(y[0], 1.5f);
  EXPECT_FLOAT_EQ(y[1], 1.0f);
  EXPECT_FLOAT_EQ(y[2], 3.0f);
  const uint16_t wb[] = {f32_to_bf16(2), f32_to_bf16(-0.5f)};  // (1, 2) in bf16
  ref::linear(x, wb, DType::bf16, nullptr, y, 1, 1, 2);
  EXPECT_FLOAT_EQ(y[0], 1.0f);
}

TEST(Reference, LinearInt8Small) {
  const float x[] = {1, 2};
  const int8_t w[] = {127, -1, 0, 3};  // (2, 2): one block per row
  const float scale[] = {0.5f, 2.0f}, b[] = {1, -1};
  float y[2];
  ref::linear_int8(x, w, scale, b, y, 1, 2, 2);
  EXPECT_FLOAT_EQ(y[0], (127 - 2) * 0.5f + 1);  // 63.5
  EXPECT_FLOAT_EQ(y[1], 6 * 2.0f - 1);          // 11
  // K = 40: a full block of 32 (scale 0.5) and a partial one of 8 (scale 3).
  std::vector<float> ones(40, 1.0f);
  std::vector<int8_t> w2(40, 1);
  for (int k = 32; k < 40; ++k) w2[size_t(k)] = 2;
  const float s2[] = {0.5f, 3.0f};
  ref::linear_int8(ones.data(), w2.data(), s2, nullptr, y, 1, 1, 40);
  EXPECT_FLOAT_EQ(y[0], 32 * 0.5f + 8 * 2 * 3.0f);  // 64
}

// Every target quantizes to int4 as the scalar target does: the same extremes (including equal
// magnitudes of both signs, where the first wins), scales and round-to-nearest-even codes (K =
// 1000: 31 full blocks and a partial one; values over five orders of magnitude, exact ties).
TEST(Ops, QuantizeInt4SameBytesOnEveryTarget) {
  std::mt19937 rng(17);
  const int64_t N = 16, K = 1000, nb = int4_blocks(K);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor w = random_tensor(rng, size_t(N * K), dt, -1.0f, 1.0f);
    for (size_t i = 0; i < w.f.size(); i += 7) w.f[i] *= float(std::pow(10.0, double(i % 5) - 2));
    // Row 1, block 0: extremes 8 and -8 (the first, 8, sets the scale -1), the rest on half
    // steps: ties k + 0.5.
    for (int64_t k = 0; k < kInt4Block; ++k)
      w.f[size_t(K + k)] = k == 0 ? 8.0f : k == 1 ? -8.0f : float(k % 15) - 7.5f;
    // Row 2, block 1: -8 before 8, the rest small.
    for (int64_t k = kInt4Block; k < 2 * kInt4Block; ++k)
      w.f[size_t(2 * K + k)] = k == 40 ? -8.0f : k == 41 ? 8.0f : 0.25f * float(k % 5);
    if (dt == DType::bf16)
      for (size_t i = 0; i < w.f.size(); ++i) {
        w.h[i] = f32_to_bf16(w.f[i]);
        w.f[i] = bf16_to_f32(w.h[i]);
      }
    TargetGuard guard;
    ThreadPool pool(2);
    const size_t bytes = size_t(N / kInt4Rows * nb * kInt4TileBytes);
    std::vector<uint8_t> want(bytes), q(bytes);
    std::vector<uint16_t> want_scale(size_t(N * nb)), scale(size_t(N * nb));
    set_active_target(Target::kScalar);
    quantize_int4(w.data(), dt, want.data(), want_scale.data(), N, K, pool);
    EXPECT_EQ(f16_to_f32(want_scale[0 * kInt4Rows + 1]), -1.0f);  // row 1, block 0
    EXPECT_EQ(f16_to_f32(want_scale[1 * kInt4Rows + 2]), 1.0f);   // row 2, block 1
    for (Target t : supported_targets()) {
      set_active_target(t);
      quantize_int4(w.data(), dt, q.data(), scale.data(), N, K, pool);
      EXPECT_EQ(q, want) << target_name(t) << " " << dtype_name(dt);
      EXPECT_EQ(scale, want_scale) << target_name(t) << " " << dtype_name(dt);
    }
  }
}

// The tile layout and the int4 reference by hand: 8 rows, K = 40 (a full block and a partial one)
// of codes in row order, packed, read back code by code, and multiplied.
TEST(Reference, LinearInt4Small) {
  const int64_t K = 40;
  std::vector<uint8_t> codes(size_t(8 * K));
  for (int64_t j = 0; j < 8; ++j)
    for (int64_t k = 0; k < K; ++k) codes[size_t(j * K + k)] = uint8_t((j + 3 * k) % 16);
  std::vector<uint8_t> tiles(2 * kInt4TileBytes, 0xee);
  pack_int4_tiles(codes.data(), K, K, tiles.data());
  for (int64_t j = 0; j < 8; ++j)
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(int4_code(tiles.data(), K, j, k), codes[size_t(j * K + k)]) << j << " " << k;
  // Byte 32 v + 4 j + t holds k = 8 v + t low and 8 v + 4 + t high: row 1, v = 2, t = 3.
  EXPECT_EQ(tiles[32 * 2 + 4 * 1 + 3], uint8_t(codes[1 * K + 19] | codes[1 * K + 23] << 4));
  EXPECT_EQ(tiles[kInt4TileBytes + 32 * 3 + 4 * 7 + 3], 0);  // k = 59 and 63: padding
  // Scales [block][row]: 0.5 then 2 for row 0; zero points 8 (none) or 3.
  std::vector<uint16_t> scale(16, f32_to_f16(1.0f));
  scale[0] = f32_to_f16(0.5f);
  scale[8] = f32_to_f16(2.0f);
  std::vector<uint8_t> zero(16, 3);
  std::vector<float> x(K, 1.0f), y(8);
  const float bias[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  for (bool with_zero : {false, true}) {
    ref::linear_int4(x.data(), tiles.data(), scale.data(), with_zero ? zero.data() : nullptr, bias,
                     y.data(), 1, 8, K);
    const double z = with_zero ? 3 : 8;
    double want = 1;
    for (int64_t k = 0; k < K; ++k) want += (k < 32 ? 0.5 : 2.0) * (codes[size_t(k)] - z);
    EXPECT_FLOAT_EQ(y[0], float(want)) << with_zero;
  }
}

TEST(Reference, RmsNormOf3And4) {
  // mean(x^2) = (9 + 16) / 2 = 12.5; y = x / sqrt(12.5) * w.
  const float x[] = {3, 4}, w[] = {1, 2};
  float y[2];
  ref::rms_norm(x, w, DType::f32, y, 1, 2, 0.0f);
  EXPECT_NEAR(y[0], 0.8485281374, 1e-6);
  EXPECT_NEAR(y[1], 2.2627416998, 1e-6);
}

TEST(Reference, RmsNormUnitOffset) {
  // Gemma: the same normalized x times (1 + w); w = (0, 1) gives the factors (1, 2) above.
  const float x[] = {3, 4}, w[] = {0, 1};
  float y[2];
  ref::rms_norm(x, w, DType::f32, y, 1, 2, 0.0f, true);
  EXPECT_NEAR(y[0], 0.8485281374, 1e-6);
  EXPECT_NEAR(y[1], 2.2627416998, 1e-6);
}

TEST(Reference, RopeLayouts) {
  // D = 4, frequencies (90 degrees, 0) at position 1.
  const int32_t pos[] = {1};
  const float inv_freq[] = {float(M_PI / 2), 0.0f};
  // Rotate-half: pairs (0, 2) and (1, 3). (x0, x2) = (1, 5) turns to (-5, 1); (x1, x3) stays.
  float a[] = {1, 0, 5, 6};
  ref::rope(a, pos, inv_freq, 1, 1, 4, 4, false);
  const float want_a[] = {-5, 0, 1, 6};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(a[i], want_a[i], 1e-6) << i;
  // Interleaved (GLM): pairs (0, 1) and (2, 3). (x0, x1) = (1, 0) turns to (0, 1); (5, 6) stays.
  float b[] = {1, 0, 5, 6};
  ref::rope(b, pos, inv_freq, 1, 1, 4, 4, true);
  const float want_b[] = {0, 1, 5, 6};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(b[i], want_b[i], 1e-6) << i;
  // Partial rotary: head_dim 6 with the first 4 rotated as above, features 4 and 5 untouched.
  float c[] = {1, 0, 5, 6, 7, 8};
  ref::rope(c, pos, inv_freq, 1, 1, 6, 4, false);
  const float want_c[] = {-5, 0, 1, 6, 7, 8};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(c[i], want_c[i], 1e-6) << i;
}

TEST(Reference, GeluTanhScaleSoftcap) {
  // gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), values from Python's math.
  const float g[] = {0, 1, -1, 2, -3}, up[] = {7, 1, 1, 0.5f, 2};
  float y[5];
  ref::gelu_tanh_mul(g, up, y, 5);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.8411919906082768, 1e-7);
  EXPECT_NEAR(y[2], -0.15880800939172324, 1e-7);
  EXPECT_NEAR(y[3], 0.5 * 1.954597694087775, 1e-7);
  EXPECT_NEAR(y[4], 2 * -0.0036373920817729943, 1e-9);
  ref::scale(g, 0.5f, y, 5);
  EXPECT_EQ(y[4], -1.5f);
  // tanh(x / 2) * 2 = 1 at x = 2 atanh(1/2); odd; 0 at 0; nearly the cap far out.
  const float x[] = {1.0986122886681096f, -1.0986122886681096f, 0.0f, 1000.0f};
  ref::softcap(x, 2.0f, y, 4);
  EXPECT_NEAR(y[0], 1.0, 1e-7);
  EXPECT_NEAR(y[1], -1.0, 1e-7);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 2.0f);
}

TEST(Reference, AttentionSlidingWindowAndSoftcap) {
  // D = 1 and q = 0: every score is 0, so each query averages the values it sees, 1 2 3 4 at
  // slots 0-3, which shows the visible slots.
  const float q0[] = {0, 0, 0}, k[] = {5, -5, 2, 9}, v[] = {1, 2, 3, 4};
  float out[3];
  auto decode = [&](int64_t window, const int32_t* mask) {
    ref::attention(q0, k, v, DType::f32, mask, out, 1, 1, 1, 1, 4, 1, 3, 1.0f, window);
    return out[0];
  };
  EXPECT_NEAR(decode(2, nullptr), 3.5, 1e-6);  // slot 3 sees 2 and 3
  EXPECT_NEAR(decode(1, nullptr), 4.0, 1e-6);  // itself only
  EXPECT_NEAR(decode(4, nullptr), 2.5, 1e-6);  // all four
  EXPECT_NEAR(decode(9, nullptr), 2.5, 1e-6);  // a window past slot 0 changes nothing
  const int32_t mask[] = {1, 1, 0, 1};
  EXPECT_NEAR(decode(2, mask), 4.0, 1e-6);  // slot 2 is padding
  // Prefill of 3 tokens from slot 0, window 2: slots {0}, {0, 1}, {1, 2}.
  ref::attention(q0, k, v, DType::f32, nullptr, out, 1, 3, 1, 1, 4, 1, 0, 1.0f, 2);
  EXPECT_NEAR(out[0], 1.0, 1e-6);
  EXPECT_NEAR(out[1], 1.5, 1e-6);
  EXPECT_NEAR(out[2], 2.5, 1e-6);
  // Soft cap 1: q = 1 and keys 2, 0 score tanh(2) and 0 (not 2 and 0); values 1 and 3.
  const float q1[] = {1}, k2[] = {2, 0}, v2[] = {1, 3};
  ref::attention(q1, k2, v2, DType::f32, nullptr, out, 1, 1, 1, 1, 2, 1, 1, 1.0f, 0, 1.0f);
  const double p0 = std::exp(std::tanh(2.0)) / (std::exp(std::tanh(2.0)) + 1.0);
  EXPECT_NEAR(out[0], p0 * 1 + (1 - p0) * 3, 1e-6);  // 1.5521
}

TEST(Reference, RopeQuarterTurn) {
  // D = 2: one pair (x0, x1) rotated by pos * inv_freq = 90 degrees: (1, 0) -> (0, 1).
  float x[] = {1, 0};
  const int32_t pos[] = {1};
  const float inv_freq[] = {float(M_PI / 2)};
  ref::rope(x, pos, inv_freq, 1, 1, 2, 2, false);
  EXPECT_NEAR(x[0], 0.0f, 1e-6);
  EXPECT_NEAR(x[1], 1.0f, 1e-6);
  // Position 0 is the identity.
  float z[] = {0.25f, -3.0f};
  const int32_t pos0[] = {0};
  ref::rope(z, pos0, inv_freq, 1, 1, 2, 2, false);
  EXPECT_EQ(z[0], 0.25f);
  EXPECT_EQ(z[1], -3.0f);
}

TEST(Reference, AttentionTwoKeys) {
  // q = (1, 0), keys (1, 0) and (0, 1): scores 1 and 0, softmax (e, 1) / (e + 1);
  // values (1, 2) and (3, 4).
  const float q[] = {1, 0};
  const float k[] = {1, 0, 0, 1};
  const float v[] = {1, 2, 3, 4};
  float out[2];
  // T = 1 at start = 1: the query sits at slot 1 and sees slots 0 and 1.
  ref::attention(q, k, v, DType::f32, nullptr, out, 1, 1, 1, 1, 2, 2, 1, 1.0f);
  const double p0 = std::exp(1.0) / (std::exp(1.0) + 1.0), p1 = 1.0 - p0;
  EXPECT_NEAR(out[0], p0 * 1 + p1 * 3, 1e-6);
  EXPECT_NEAR(out[1], p0 * 2 + p1 * 4, 1e-6);
  // Masking slot 0 leaves only value (3, 4).
  const int32_t mask[] = {0, 1};
  ref::attention(q, k, v, DType::f32, mask, out, 1, 1, 1, 1, 2, 2, 1, 1.0f);
  EXPECT_NEAR(out[0], 3.0f, 1e-6);
  EXPECT_NEAR(out[1], 4.0f, 1e-6);
  // Causality: at start = 0 the query sees slot 0 only.
  ref::attention(q, k, v, DType::f32, nullptr, out, 1, 1, 1, 1, 2, 2, 0, 1.0f);
  EXPECT_NEAR(out[0], 1.0f, 1e-6);
  EXPECT_NEAR(out[1], 2.0f, 1e-6);
  // A query that sees no key gets zeros.
  const int32_t none[] = {0, 0};
  ref::attention(q, k, v, DType::f32, none, out, 1, 1, 1, 1, 2, 2, 1, 1.0f);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(Reference, AttentionTwoKeysWithASink) {
  // As AttentionTwoKeys: scores 1 and 0, values (1, 2) and (3, 4); a sink of 0.5 joins the
  // softmax: weights e^0 and e^-1 over e^0 + e^-1 + e^-0.5 (the max, 1, subtracted).
  const float q[] = {1, 0}, k[] = {1, 0, 0, 1}, v[] = {1, 2, 3, 4};
  const float sink[] = {0.5f};
  float out[2];
  ref::attention(q, k, v, DType::f32, nullptr, out, 1, 1, 1, 1, 2, 2, 1, 1.0f, 0, 0.0f, sink);
  const double den = 1.0 + std::exp(-1.0) + std::exp(-0.5);
  const double p0 = 1.0 / den, p1 = std::exp(-1.0) / den;
  EXPECT_NEAR(out[0], p0 * 1 + p1 * 3, 1e-6);
  EXPECT_NEAR(out[1], p0 * 2 + p1 * 4, 1e-6);
  // A sink above the scores is the max: weights e^(1 - 50), e^(0 - 50) over about 1.
  const float big[] = {50.0f};
  ref::attention(q, k, v, DType::f32, nullptr, out, 1, 1, 1, 1, 2, 2, 1, 1.0f, 0, 0.0f, big);
  EXPECT_NEAR(out[0], std::exp(-49.0) * 1 + std::exp(-50.0) * 3, 1e-25);
  EXPECT_GT(out[0], 0.0f);
  // A query that sees no key gets zeros, the sink's weight notwithstanding.
  const int32_t none[] = {0, 0};
  ref::attention(q, k, v, DType::f32, none, out, 1, 1, 1, 1, 2, 2, 1, 1.0f, 0, 0.0f, sink);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
}

TEST(Reference, SiluMulAndAdd) {
  const float g[] = {0, 1, -2}, u[] = {5, 2, 1};
  float y[3];
  ref::silu_mul(g, u, y, 3);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 2.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(y[2], -2.0 / (1.0 + std::exp(2.0)), 1e-6);
  ref::add(g, u, y, 3);
  EXPECT_EQ(y[0], 5.0f);
  EXPECT_EQ(y[2], -1.0f);
}

TEST(Reference, CacheWriteRoundsToNearestEven) {
  // bf16 keeps 8 significant bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and rounds to the
  // even 1.0; 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 and rounds to 1 + 2^-6.
  const float src[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f};  // (B=1, T=1, Hkv=1, D=2)
  uint16_t cache[2 * 3] = {};                                // (1, 1, S=3, D=2)
  ref::cache_write(cache, DType::bf16, src, 1, 1, 1, 3, 2, 1);
  EXPECT_EQ(cache[0], 0);
  EXPECT_EQ(cache[2], 0x3f80);  // 1.0
  EXPECT_EQ(cache[3], 0x3f82);  // 1.015625
  EXPECT_EQ(cache[4], 0);
}

// The other rules of f32 -> bf16 that a cache write follows, each input's bits beside the bf16
// bits the rule gives: a NaN stays a NaN of its sign with the quiet bit set (a signalling one
// too, whose payload would otherwise truncate to infinity), infinities and zeros keep their sign,
// the largest finite float rounds up to infinity, a subnormal rounds to the nearest bf16 (the
// smallest to +0, the largest up to the smallest normal), and above a tie the nearer one wins.
TEST(Reference, CacheWriteRoundsSpecialValues) {
  const std::pair<uint32_t, uint16_t> cases[] = {
      {0x7fc00000, 0x7fc0}, {0xffc00001, 0xffc0}, {0x7f800001, 0x7fc0}, {0xff800001, 0xffc0},
      {0x7f800000, 0x7f80}, {0xff800000, 0xff80}, {0x00000000, 0x0000}, {0x80000000, 0x8000},
      {0x7f7fffff, 0x7f80}, {0xff7fffff, 0xff80}, {0x00000001, 0x0000}, {0x807fffff, 0x8080},
      {0x3f80ffff, 0x3f81}, {0xbf808001, 0xbf81}};
  for (const auto& [in, want] : cases) {
    const float src = std::bit_cast<float>(in);
    uint16_t cache = 0x1234;  // (B=1, T=1, Hkv=1, S=1, D=1)
    ref::cache_write(&cache, DType::bf16, &src, 1, 1, 1, 1, 1, 0);
    EXPECT_EQ(cache, want) << std::hex << "input 0x" << in;
  }
}

TEST(Reference, EmbeddingGathersRows) {
  const float table[] = {1, 2, 3, 4, 5, 6};  // (3, 2)
  const int32_t ids[] = {2, 0};
  float out[4];
  ref::embedding(table, DType::f32, ids, 2, 2, out);
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 2.0f);
}

}  // namespace
}  // namespace tformers::cpu
