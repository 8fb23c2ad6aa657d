// Host memory for large, long-lived buffers: weights, KV caches, conversions. Anonymous pages
// aligned to 2 MiB with transparent huge pages requested (madvise(MADV_HUGEPAGE)). On some hosts
// a file-backed mapping streams at a third of what anonymous memory with huge pages gives, and
// decoding reads every weight once per token, so where weights live sets decode speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "tformers/tensor.h"

namespace tformers {

// Buffers from this size up get their own 2 MiB-aligned pages; smaller ones come from malloc.
constexpr size_t kHugePage = size_t(2) << 20;

// The bytes of memory this process can have: the machine's physical memory, lowered by its
// address-space and data limits (ulimit -v, ulimit -d) and, in a container, by its cgroup's
// memory.max. Plans (how many rows, how long a cache) are checked against it before they
// allocate, so that an absurd one is refused at once instead of after the machine swaps.
uint64_t memory_limit_bytes();

// A planned byte count, multiplied out in doubles so that absurd sizes cannot wrap: the count,
// or "more than 2^64".
std::string planned_bytes(double bytes);

// `bytes` of zero-filled memory aligned to 2 MiB (fresh anonymous pages are zero, so nothing is
// written); released when the last owner goes. Error when the system has no memory for it.
std::shared_ptr<void> allocate_pages(size_t bytes);

// Returns the whole pages inside `t`'s bytes to the system (madvise(MADV_DONTNEED)). For a view
// of a read-only file mapping that was copied or converted: the pages stay in the page cache and
// are read again if touched, but stop counting towards this process's resident memory, so a load
// holds the copy rather than both.
void release_pages(const Tensor& t);

// A zero tensor for a long-lived buffer (a KV cache): from allocate_pages from kHugePage bytes
// up, else Tensor::zeros. Transient tensors (logits, conversions) stay with Tensor::zeros, since
// mapping and unmapping pages per call would cost more than they save.
Tensor resident_zeros(const Shape& shape, DType dtype);

// A copy of `t` in its own memory: from allocate_pages, copied in parallel over `pool`, from
// kHugePage bytes up; below that (norms, biases), from malloc.
Tensor resident_copy(const Tensor& t, ThreadPool& pool);

// Reads `n` bytes at `offset` of a tensor's bytes into `dst`; throws on failure.
using ByteReader = std::function<void(size_t offset, void* dst, size_t n)>;

// As resident_copy, for a tensor of `shape` and `dtype` whose bytes come from `read` (a file,
// with pread) instead of memory; the first exception a chunk's read throws is rethrown here.
Tensor resident_read(const Shape& shape, DType dtype, const ByteReader& read, ThreadPool& pool);

}  // namespace tformers
