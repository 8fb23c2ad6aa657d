#include "core/memory.h"

#include <exception>
#include <mutex>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <cstdint>
#include <cstring>

#include "tformers/error.h"

namespace tformers {

uint64_t memory_limit_bytes() {
  uint64_t limit = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    struct rlimit rl;
    if (getrlimit(resource, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      limit = std::min<uint64_t>(limit, rl.rlim_cur);
  }
  // cgroup v2 as a container sees it; the file reads "max" (no number) when there is no limit.
  uint64_t cgroup = 0;
  if (std::ifstream("/sys/fs/cgroup/memory.max") >> cgroup && cgroup > 0)
    limit = std::min(limit, cgroup);
  return limit;
}

std::string planned_bytes(double bytes) {
  return bytes < 1.8e19 ? std::to_string(uint64_t(bytes)) : "more than 2^64";
}

std::shared_ptr<void> allocate_pages(size_t bytes) {
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  if (size < bytes) throw Error("cannot allocate " + std::to_string(bytes) + " bytes");
  // Map one huge page more than needed, then return the unaligned head and tail.
  void* raw =
      mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    throw Error("out of memory: cannot map " + std::to_string(bytes) +
                " bytes for weights or caches; free memory, use a smaller dtype or quantize, or "
                "load with load_mode \"mmap\"");
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = aligned + size, raw_end = base + size + kHugePage;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
  void* p = reinterpret_cast<void*>(aligned);
  // Advice only: without transparent huge pages the memory works with small pages.
  madvise(p, size, MADV_HUGEPAGE);
  return std::shared_ptr<void>(p, [size](void* q) { munmap(q, size); });
}

void release_pages(const Tensor& t) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (uintptr_t(t.raw()) + page - 1) / page * page;
  const uintptr_t hi = (uintptr_t(t.raw()) + t.nbytes()) / page * page;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

Tensor resident_zeros(const Shape& shape, DType dtype) {
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  if (bytes < kHugePage) return Tensor::zeros(shape, dtype);
  std::shared_ptr<void> mem = allocate_pages(bytes);
  void* data = mem.get();
  return Tensor::borrow(shape, dtype, data, std::move(mem));
}

Tensor resident_copy(const Tensor& t, ThreadPool& pool) {
  if (t.nbytes() < kHugePage) {  // a norm or a bias: a page of its own would mostly be waste
    Tensor small = Tensor::zeros(t.shape(), t.dtype());
    std::memcpy(small.raw(), t.raw(), t.nbytes());
    return small;
  }
  std::shared_ptr<void> mem = allocate_pages(t.nbytes());
  const char* src = static_cast<const char*>(t.raw());
  char* dst = static_cast<char*>(mem.get());
  // Chunks of 2 MiB: each thread faults in and fills whole huge pages.
  const int64_t chunks = int64_t((t.nbytes() + kHugePage - 1) / kHugePage);
  pool.parallel_for(
      chunks,
      [&](int64_t begin, int64_t end, int) {
        const size_t lo = size_t(begin) * kHugePage;
        const size_t hi = std::min(t.nbytes(), size_t(end) * kHugePage);
        std::memcpy(dst + lo, src + lo, hi - lo);
      },
      1);
  void* data = mem.get();
  return Tensor::borrow(t.shape(), t.dtype(), data, std::move(mem));
}

Tensor resident_read(const Shape& shape, DType dtype, const ByteReader& read, ThreadPool& pool) {
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  if (bytes < kHugePage) {
    Tensor small = Tensor::zeros(shape, dtype);
    read(0, small.raw(), bytes);
    return small;
  }
  std::shared_ptr<void> mem = allocate_pages(bytes);
  char* dst = static_cast<char*>(mem.get());
  // The pool runs plain functions: an exception is carried out of the workers by hand.
  std::mutex failed_mutex;
  std::exception_ptr failed;
  const int64_t chunks = int64_t((bytes + kHugePage - 1) / kHugePage);
  pool.parallel_for(
      chunks,
      [&](int64_t begin, int64_t end, int) {
        const size_t lo = size_t(begin) * kHugePage;
        const size_t hi = std::min(bytes, size_t(end) * kHugePage);
        try {
          read(lo, dst + lo, hi - lo);
        } catch (...) {
          std::lock_guard<std::mutex> lock(failed_mutex);
          if (!failed) failed = std::current_exception();
        }
      },
      1);
  if (failed) std::rethrow_exception(failed);
  void* data = mem.get();
  return Tensor::borrow(shape, dtype, data, std::move(mem));
}

}  // namespace tformers
