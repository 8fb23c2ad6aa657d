// CPU kernels used by the CPU executor. All activations are f32; weights and the KV cache are
// f32 or bf16 as stored, and the weights of linear, embedding and rms_norm may also be f16
// (widened to f32 as they are read: correct everywhere, fast nowhere). Each function validates
// nothing (the graph checked shapes when it was built); each dispatches to the best implementation
// for cpu::active_target() and splits work over the given pool. Shapes are written outermost first.
//
// Every kernel has a plain scalar reference in kernels_ref.cc (namespace ref), used by the
// op-consistency tests as the ground truth on every CPU target.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "tformers/dtype.h"

namespace tformers::cpu {

// What the rows of a linear's x are, which picks its kernel on the x86 targets. kDecode: each
// row is one sequence's next token (a decode step of any batch size); the GEMV runs at any M, and
// its sums for a row depend only on K, so a row gets the same bits whatever rows share the call:
// a sequence's logits do not depend on the batch it decodes in. kAny: rows may be a prompt's
// tokens; below 4 rows the GEMV runs, from 4 the GEMM, whose sums are ordered otherwise (each
// row's still independent of the others). The scalar target has one path for both, and so has
// the AMX target for bf16 weights (its tiles).
enum class LinearRows { kAny, kDecode };

// y (M,N) = x (M,K) @ w (N,K)^T [+ bias (N), f32 or wt]. w is in checkpoint (PyTorch Linear)
// layout, dtype wt in {f32, bf16, f16}. On AVX-512 BF16, x is rounded to bf16 for bf16 weights (in
// the GEMV and the GEMM alike); f32 weights keep x in f32.
void linear(const float* x, const void* w, DType wt, const void* bias, float* y, int64_t M,
            int64_t N, int64_t K, ThreadPool& pool, LinearRows rows = LinearRows::kAny);

// int8 weight-only quantization works on blocks of kInt8Block consecutive k values of one output
// channel (row of w), each with its own f32 scale, as llama.cpp's Q8_0: a block is 32 bytes of
// int8 plus 4 bytes of scale (9 bits per weight). Per-block rather than per-row scales because
// one large weight then costs precision only in its own block (on tiny-qwen3's goldens the
// relative cross-entropy difference of tests/models/test_quantized.cc was 2.2 % with one scale
// per row, over the 2 % bound, and 1.5 % with 32-blocks).
constexpr int64_t kInt8Block = 32;
inline int64_t int8_blocks(int64_t K) { return (K + kInt8Block - 1) / kInt8Block; }

// y (M,N) = x (M,K) @ (scale * w) (N,K)^T [+ bias (N)], w int8 (N,K) and scale f32
// (N, int8_blocks(K)): w[n,k] ~ scale[n, k / kInt8Block] * q[n,k]. How x is taken depends on
// the target: the scalar target, plain AVX-512 and the AVX2 GEMM keep it in f32 (the int8 values
// widen to f32 exactly, so only the summation order differs from the reference); the AVX2 GEMV
// rounds it to int16 per 32-block; on AVX-512 BF16 the GEMV (decode rows, M < 4) rounds it to
// int8 per block and sums exact integer products (as llama.cpp's Q8_0 x Q8_0), and the GEMM
// rounds it to bf16 as for bf16 weights, each block's scale applied to its partial sums.
void linear_int8(const float* x, const int8_t* w, const float* scale, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K, ThreadPool& pool,
                 LinearRows rows = LinearRows::kAny);

// Symmetric quantization of w (N,K) (f32 or bf16) per block: scale = max|block| / 127,
// q = round(w / scale) in [-127, 127] (ties to even; an all-zero block gets scale 0 and zeros).
void quantize_int8(const void* w, DType wt, int8_t* q, float* scale, int64_t N, int64_t K,
                   ThreadPool& pool);

// int4 weight-only quantization: blocks of kInt4Block k values of one output channel share an
// f16 scale (and, for imported AWQ/GPTQ checkpoints, a zero point), as llama.cpp's Q4_0 (32
// four-bit codes and an f16 scale: 4.5 bits per weight). Each weight is a code c in [0, 15]:
//   w[n, k] = scale[n, b] * (c[n, k] - zero[n, b]),  b = k / kInt4Block,
// with zero 8 when the weight has no zero points (the symmetric form --quantize int4 writes).
//
// Layout ("tiles"), chosen for the decode GEMV and the GEMM's panels: rows are taken 8 at a time
// (a row group; N must be a multiple of kInt4Rows) and K is cut into blocks of 32 (the last one
// padded with zero weights), and a tile is one row group by one block: 8 x 32 codes in 128 bytes.
// Byte 32 v + 4 j + t of a tile (v < 4, j < 8, t < 4) holds row j's codes at k = 8 v + t (low
// nibble) and k = 8 v + 4 + t (high nibble) of the block. A 32-byte load of part v therefore
// unpacks (a mask, a shift and a mask) into two vectors of 8 lanes, one lane per row, each lane
// holding 4 consecutive codes of its row: the GEMV multiplies them with 4 x values broadcast to
// every lane (vpmaddubsw), so each 32-bit lane sums one row's block and 8 rows come out in one
// vector, with no horizontal sums, and each row's block scale applies lane by lane; the GEMM
// takes each byte position t of a lane as the 8 rows' weights at one k, which is the K-major
// order its panels want. Tiles are stored row group by row group, block by block:
//   codes u8 (N / 8, nb, 128), scale f16 (N / 8, nb, 8), zero u8 (N / 8, nb, 8) (optional),
// scale and zero of row 8 g + j at [g, b, j]; nb = int4_blocks(K). Padding codes (k >= K) are
// 0: kernels never read them as weights (the GEMV multiplies them by zeros).
constexpr int64_t kInt4Block = 32;
constexpr int64_t kInt4Rows = 8;
constexpr int64_t kInt4TileBytes = kInt4Rows * kInt4Block / 2;
inline int64_t int4_blocks(int64_t K) { return (K + kInt4Block - 1) / kInt4Block; }

// y (M,N) = x (M,K) @ w (N,K)^T [+ bias (N)] with w in the int4 tiles above (zero null: 8).
// The GEMV (decode rows and M < 4 on the x86 targets) rounds each 32-value block of x to int8
// with its own scale (as llama.cpp's Q8_0 activations; relative error at most 2^-8 of the block's
// largest |x|) and sums exact integer products; the GEMM and the scalar target multiply the exact
// f32 weights (the AVX-512 BF16 GEMM exact codes by x rounded to bf16, the block scales applied
// per block). Either way a row's result does not depend on the other rows of x.
void linear_int4(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool,
                 LinearRows rows = LinearRows::kAny);

// Quantization of w (N,K) (f32 or bf16; N a multiple of 8) into tiles with zero 8, per block as
// Q4_0 but rounding to nearest: m = the value of largest magnitude, scale = f16(m / -8), and
// c = clamp(round(w / scale), -8, 7) + 8 with the stored (rounded) scale, so m itself maps to
// code 0 and the block keeps all 16 levels. An all-zero block gets scale 0.
void quantize_int4(const void* w, DType wt, uint8_t* tiles, uint16_t* scale, int64_t N, int64_t K,
                   ThreadPool& pool);

// Writes one row group's tiles (nb of them) from codes in row order: 8 rows of K codes, row r at
// codes + r * stride. Used by quantize_int4 and by the importers of other 4-bit formats.
void pack_int4_tiles(const uint8_t* codes, int64_t stride, int64_t K, uint8_t* tiles);
// The code of row n, column k in tiles of K columns (the inverse of pack_int4_tiles).
inline uint8_t int4_code(const uint8_t* tiles, int64_t K, int64_t n, int64_t k) {
  const int64_t b = k / kInt4Block, i = k % kInt4Block, v = i / 8, t = i % 4;
  const uint8_t byte = tiles[((n / kInt4Rows) * int4_blocks(K) + b) * kInt4TileBytes + 32 * v +
                             4 * (n % kInt4Rows) + t];
  return (i % 8) < 4 ? byte & 15 : byte >> 4;
}

// MXFP4 weights (OCP microscaling, as gpt-oss stores its experts), used as the checkpoint lays
// them out: each output row n is cut into blocks of kMxfp4Block k values, and a block is 16
// bytes of 4-bit e2m1 codes (byte i: k = 2i in the low nibble, k = 2i + 1 in the high one) and
// one e8m0 scale byte s:
//   w[n, k] = e2m1(code) * 2^(s - 127),  e2m1 codes 0..7 = {0, 0.5, 1, 1.5, 2, 3, 4, 6},
// codes 8..15 their negatives (bit 3 the sign). Scales are 0..254 (255, NaN in the format, does
// not occur in checkpoints).
//   codes u8 (N, K / 2) (= (N, K / 32, 16)), scales u8 (N, K / 32), K a multiple of 32.
constexpr int64_t kMxfp4Block = 32;

// y (M,N) = x (M,K) @ w (N,K)^T [+ bias (N)] with w in MXFP4 as above. The weights are exact
// (every w is an f32 value) and x stays f32: products and sums round in f32 as the reference's
// do, in another order. Each block's dot product is summed on its own and then multiplied by its
// scale, so a weight that would overflow f32 (6 * 2^127) never forms. A row's sums are ordered
// the same way whatever M is and whichever LinearRows is given (on the x86 targets the GEMV of up
// to 4 rows and the GEMM of more run the same register tiles): a row's bits depend on nothing but
// itself, the weights and K.
void linear_mxfp4(const float* x, const uint8_t* codes, const uint8_t* scales, const float* bias,
                  float* y, int64_t M, int64_t N, int64_t K, ThreadPool& pool,
                  LinearRows rows = LinearRows::kAny);

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

// Gated DeltaNet's ops over recurrent states (graph.h's kCausalConv1d and kGatedDeltaRule and
// their paged forms, whose semantics these are), per batch row: where its state lies (null for a
// row of padding only, which keeps none), whether it starts a sequence (its state counts as
// zeros) and which of its tokens are real (a padding token is skipped).
struct RecurrentRows {
  std::vector<float*> state;   // B
  std::vector<uint8_t> fresh;  // B
  std::vector<uint8_t> real;   // B * T
};
// x (B,T,C), w (C,K), a row's state (K-1,C); q, k (B,T,Hk,Dk), v (B,T,H,Dv), g and beta (B,T,H),
// a row's state (H,Dk,Dv), y (B,T,H,Dv). The states are written in place. Both run the recurrent
// form token by token, on every target (plain loops that each target's compiler vectorizes; the
// scalar table's are the reference): a value head's state is Dk x Dv floats, read and written
// twice a token while it sits in the core's cache, and its arithmetic (about 6 Dk Dv flops a
// token) is small beside the layer's projections, so the chunked form that GPUs use (fla's) buys
// a CPU little at these sizes.
void causal_conv1d(const float* x, const float* w, const RecurrentRows& rows, float* y, int64_t B,
                   int64_t T, int64_t C, int64_t K, ThreadPool& pool);
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const RecurrentRows& rows, float* y, int64_t B, int64_t T,
                      int64_t Hk, int64_t H, int64_t Dk, int64_t Dv, ThreadPool& pool);

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
// tanh(s / softcap) * softcap when softcap > 0, before the softmax. With sinks (Hq), query head
// h's softmax also counts the logit sinks[h] in its max and denominator, which weighs no value
// (gpt-oss): p_j = exp(s_j - m) / (sum_j exp(s_j - m) + exp(sinks[h] - m)), m the max of both;
// null: none. Only slots < start + T (and inside the windows) are read, so the cost follows the
// used length (or the window), not S. A query that sees no key gets zeros. Per-thread scratch
// (scores) is kept thread_local and only grows, so steady-state decode allocates nothing.
void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, int64_t window, float softcap,
               const float* sinks, ThreadPool& pool);
// Without window, softcap or sinks. Kept as its own symbol: bench_ab reaches two library builds'
// attention through this exported signature.
void attention(const float* q, const void* k_cache, const void* v_cache, DType cache_type,
               const int32_t* key_mask, float* out, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
               int64_t S, int64_t D, int64_t start, float scale, ThreadPool& pool);

// Paged KV cache: keys or values of every sequence live in blocks of one pool
// (num_blocks, Hkv, BS, D) in cache_type; sequence s's position p is at offset p % BS of block
// blocks[s * MB + p / BS] (`table` for the writes). Token (b,t) belongs to sequence
// rows[b * T + t] when rows is given (a step that packs several sequences' tokens into a row),
// else to sequence b. pos (B,T) holds each new token's position, negative for padding (skipped,
// its rows entry unread). The caller has checked that every block a position reaches is in the
// pool.
void paged_cache_write(void* pool_data, DType cache_type, const float* src, const int32_t* table,
                       const int32_t* rows, const int32_t* pos, int64_t B, int64_t T, int64_t Hkv,
                       int64_t BS, int64_t MB, int64_t D, ThreadPool& pool);
// attention() over paged keys and values (sinks as there): query (b,t) sits at position pos[b,t]
// and sees its sequence's positions j <= pos (and within the window); a negative position gets
// zeros. The static-cache kernel reads the pool through each sequence's block table, with the
// same arithmetic in the same order as over a static cache holding the sequence's positions: a
// sequence's numbers do not depend on where its blocks lie, on the other sequences of the step or
// on where its tokens sit in it, and the cost follows the positions each query attends to, not
// the batch times the longest row.
void paged_attention(const float* q, const void* k_pool, const void* v_pool, DType cache_type,
                     const int32_t* blocks, const int32_t* rows, const int32_t* pos, float* out,
                     int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB,
                     int64_t D, float scale, int64_t window, float softcap, const float* sinks,
                     ThreadPool& pool);
// One sequence per batch row, no sinks. Kept as its own symbol: bench_ab reaches two library
// builds' paged attention through this exported signature.
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
void linear_int4(const float* x, const uint8_t* w, const uint16_t* scale, const uint8_t* zero,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K);
void linear_mxfp4(const float* x, const uint8_t* codes, const uint8_t* scales, const float* bias,
                  float* y, int64_t M, int64_t N, int64_t K);
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
               float softcap = 0.0f, const float* sinks = nullptr);
void paged_cache_write(void* pool_data, DType cache_type, const float* src, const int32_t* table,
                       const int32_t* rows, const int32_t* pos, int64_t B, int64_t T, int64_t Hkv,
                       int64_t BS, int64_t MB, int64_t D);
void paged_attention(const float* q, const void* k_pool, const void* v_pool, DType cache_type,
                     const int32_t* table, const int32_t* rows, const int32_t* pos, float* out,
                     int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t BS, int64_t MB,
                     int64_t D, float scale, int64_t window, float softcap,
                     const float* sinks = nullptr);
}  // namespace ref

}  // namespace tformers::cpu
