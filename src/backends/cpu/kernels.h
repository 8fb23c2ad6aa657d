// CPU kernels used by the CPU executor. All activations are f32; weights and the KV cache are
// f32 or bf16 as stored. Each function validates nothing (the graph checked shapes when it was
// built); each dispatches to the best implementation for cpu::active_target() and splits work
// over the given pool. Shapes are written outermost first.
//
// Every kernel has a plain scalar reference in kernels_ref.cc (namespace ref), used by the
// op-consistency tests as the ground truth on every CPU target.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "tformers/dtype.h"

namespace tformers::cpu {

// y (M,N) = x (M,K) @ w (N,K)^T [+ bias (N), f32 or wt]. w is in checkpoint (PyTorch Linear)
// layout, dtype wt in {f32, bf16}.
void linear(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
            int64_t N, int64_t K, ThreadPool& pool);

// int8 weight-only quantization works on blocks of kInt8Block consecutive k values of one output
// channel (row of w), each with its own f32 scale, as llama.cpp's Q8_0: a block is 32 bytes of
// int8 plus 4 bytes of scale (9 bits per weight). Per-block rather than per-row scales because
// one large weight then costs precision only in its own block (on tiny-qwen3's goldens the
// relative cross-entropy difference of tests/models/test_quantized.cc was 2.2 % with one scale
// per row, over the 2 % bound, and 1.5 % with 32-blocks).
constexpr int64_t kInt8Block = 32;
inline int64_t int8_blocks(int64_t K) { return (K + kInt8Block - 1) / kInt8Block; }

// y (M,N) = x (M,K) @ (scale * w) (N,K)^T [+ bias (N)], w int8 (N,K) and scale f32
// (N, int8_blocks(K)): w[n,k] ~ scale[n, k / kInt8Block] * q[n,k]. Activations stay f32; the
// int8 values widen to f32 exactly, so only the summation order differs from the reference.
void linear_int8(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K, ThreadPool& pool);

// Symmetric quantization of w (N,K) (f32 or bf16) per block: scale = max|block| / 127,
// q = round(w / scale) in [-127, 127] (ties to even; an all-zero block gets scale 0 and zeros).
void quantize_int8(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                   ThreadPool& pool);

// out (n,D) = table (V,D)[ids (n)], converted to f32. Ids are in [0, V) (checked by the caller).
void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t D, float* out,
               ThreadPool& pool);

// y (M,D) = x (M,D) / sqrt(mean(x^2) + eps) * w (D), f32 math; with unit_offset the factor is
// (1 + w) instead of w (Gemma's RMSNorm, whose weights are stored as offsets from 1). y may
// alias x.
void rms_norm(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D, float eps,
              bool unit_offset, ThreadPool& pool);

// x (M,H,D) rotated in place: the first rotary_dim (even, <= D) features of each head, the rest
// left as they are (partial rotary). Pair i < rotary_dim / 2 is rotated by the angle
// pos[m] * inv_freq[i] (inv_freq already includes any rope scaling), (a, b) ->
// (a cos - b sin, b cos + a sin), where (a, b) are features (i, i + rotary_dim / 2) (rotate-half,
// Llama) or, interleaved, (2i, 2i + 1) (GLM).
void rope(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
          int64_t rotary_dim, bool interleaved, ThreadPool& pool);

// y (n) = silu(gate (n)) * up (n). y may alias gate or up.
void silu_mul(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool);

// y (n) = gelu_tanh(gate (n)) * up (n), with PyTorch's tanh approximation
// gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))). y may alias gate or up.
void gelu_tanh_mul(const float* gate, const float* up, float* y, int64_t n, ThreadPool& pool);

// y (n) = x (n) * factor. y may alias x.
void scale(const float* x, float factor, float* y, int64_t n, ThreadPool& pool);

// y (n) = tanh(x (n) / cap) * cap: a smooth clamp to (-cap, cap) (Gemma's logit soft-capping).
// y may alias x.
void softcap(const float* x, float cap, float* y, int64_t n, ThreadPool& pool);

// y (n) = a (n) + b (n). y may alias a or b.
void add(const float* a, const float* b, float* y, int64_t n, ThreadPool& pool);

// Writes new keys or values into a static cache at slots [start, start+T):
// cache (B,Hkv,S,D) in cache_type (f32|bf16); src (B,T,Hkv,D) f32.
void cache_write(void* cache, DType cache_type, const float* src, int64_t B, int64_t T, int64_t Hkv,
                 int64_t S, int64_t D, int64_t start, ThreadPool& pool);

// Scaled dot-product attention over a static KV cache, with grouped-query heads
// (query head h reads KV head h / (Hq / Hkv)).
//   q (B,T,Hq,D) f32; k_cache, v_cache (B,Hkv,S,D) in cache_type; out (B,T,Hq,D) f32.
// Query t of a row sits at cache slot p = start + t and sees key slots j <= p for which
// key_mask (B,S) is non-zero (key_mask may be null: all keys valid); with a sliding window
// (window > 0) only slots p - window < j <= p. Scores are q . k * scale, soft-capped to
// tanh(s / softcap) * softcap when softcap > 0, before the softmax. Only slots < start + T (and
// inside the windows) are read, so the cost follows the used length (or the window), not S. A
// query that sees no key gets zeros. Per-thread scratch (scores) is kept thread_local and only
// grows, so steady-state decode allocates nothing.
void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, int64_t window, float softcap,
               ThreadPool& pool);
// Without window or softcap. Kept as its own symbol: bench_ab reaches two library builds'
// attention through this exported signature.
void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, ThreadPool& pool);

// Paged KV cache: keys or values of every sequence live in blocks of one pool
// (num_blocks, Hkv, BS, D) in cache_type; sequence b's position p is at offset p % BS of block
// blocks[b * MB + p / BS] (`table` for the writes). pos (B,T) holds each new token's position,
// negative for padding (skipped). The caller has checked that every block a position reaches is in
// the pool.
void paged_cache_write(void* pool_data, DType cache_type, const float* src, const int32_t* table,
                       const int32_t* pos, int64_t B, int64_t T, int64_t Hkv, int64_t BS,
                       int64_t MB, int64_t D, ThreadPool& pool);
// attention() over paged keys and values: query (b,t) sits at position pos[b,t] and sees the
// sequence's positions j <= pos (and within the window); a negative position gets zeros. The
// positions a row's queries reach are gathered into a contiguous per-row copy first and the
// static-cache kernel runs over it: the same arithmetic in the same order as a static cache, for
// one extra pass over the used keys and values.
void paged_attention(const float* q, const void* k_pool, const void* v_pool, DType cache_type,
                     const int32_t* blocks, const int32_t* pos, float* out, int64_t B, int64_t T,
                     int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB, int64_t D, float scale,
                     int64_t window, float softcap, ThreadPool& pool);

namespace ref {
// Scalar references with the same contracts (single-threaded, no pool).
void linear(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
            int64_t N, int64_t K);
void linear_int8(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K);
void embedding(const void* table, DType dt, const int32_t* ids, int64_t n, int64_t D, float* out);
void rms_norm(const float* x, const void* w, DType wt, float* y, int64_t M, int64_t D, float eps,
              bool unit_offset = false);
void rope(float* x, const int32_t* pos, const float* inv_freq, int64_t M, int64_t H, int64_t D,
          int64_t rotary_dim, bool interleaved);
void silu_mul(const float* gate, const float* up, float* y, int64_t n);
void gelu_tanh_mul(const float* gate, const float* up, float* y, int64_t n);
void scale(const float* x, float factor, float* y, int64_t n);
void softcap(const float* x, float cap, float* y, int64_t n);
void add(const float* a, const float* b, float* y, int64_t n);
void cache_write(void* cache, DType cache_type, const float* src, int64_t B, int64_t T, int64_t Hkv,
                 int64_t S, int64_t D, int64_t start);
void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, int64_t window = 0,
               float softcap = 0.0f);
void paged_cache_write(void* pool_data, DType cache_type, const float* src, const int32_t* table,
                       const int32_t* pos, int64_t B, int64_t T, int64_t Hkv, int64_t BS,
                       int64_t MB, int64_t D);
void paged_attention(const float* q, const void* k_pool, const void* v_pool, DType cache_type,
                     const int32_t* table, const int32_t* pos, float* out, int64_t B, int64_t T,
                     int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB, int64_t D, float scale,
                     int64_t window, float softcap);
}  // namespace ref

}  // namespace tformers::cpu
