#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <unordered_map>

#include "core/std_errors.h"
#include "io/file.h"
#include "io/json.h"
#include "tformers/error.h"

namespace tformers::io {

namespace fs = std::filesystem;
using detail::str_cat;
using OrderedJson = nlohmann::ordered_json;

namespace {

// The reference implementation refuses headers above 100 MB; a real header is a few hundred KB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A cap on a whole shard, far above any real one, so a size from a sparse file cannot drive the
// mapping arithmetic near 2^64.
constexpr uint64_t kMaxSafetensorsBytes = uint64_t(1) << 42;  // 4 TiB
constexpr const char* kSupportedDtypes = "F32, BF16, F16, I32, I64, I8, U8";

// The SIGBUS guard. Reading a page of a file mapping past the file's current end raises SIGBUS,
// which would kill the process without a word when a checkpoint shrinks while it loads (in
// either load mode: "copy" copies out of the mapping too) or while it is served under "mmap".
// The handler finds the mapping the faulting address belongs to, maps zero pages over the rest
// of it (so the faulting read, retried, reads zeros), marks it truncated and returns; the load
// and every generation step then call check_mapped_files(), which turns the mark into an IoError
// naming the file. Slots are fixed and lock-free: the handler may run in any thread, at any
// moment, and must not allocate or lock.
struct GuardSlot {
  std::atomic<uintptr_t> begin{0}, end{0};  // [begin, end) page-rounded; 0: free
  std::atomic<int> truncated{0};
  char path[512] = {};
};
constexpr size_t kGuardSlots = 4096;
GuardSlot g_guard[kGuardSlots];
std::atomic<int> g_any_truncated{0};
struct sigaction g_previous_sigbus;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  for (GuardSlot& slot : g_guard) {
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    const uintptr_t end = slot.end.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= end) continue;
    const uintptr_t from = addr / page * page;
    // MAP_FIXED replaces the file's pages from the fault on: nothing past it can fault again.
    void* p = mmap(reinterpret_cast<void*>(from), end - from, PROT_READ,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) break;
    slot.truncated.store(1, std::memory_order_release);
    g_any_truncated.store(1, std::memory_order_release);
    return;
  }
  // Not a checkpoint's page: what would have happened without the guard.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    if (g_previous_sigbus.sa_sigaction) return g_previous_sigbus.sa_sigaction(sig, info, context);
  } else if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    return g_previous_sigbus.sa_handler(sig);
  }
  signal(SIGBUS, SIG_DFL);  // returning re-runs the access, which now ends the process
}

void install_sigbus_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa = {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

// The slot guarding [base, base + size), or nullptr when every slot is taken (then that file is
// unguarded, as before).
GuardSlot* guard(const uint8_t* base, size_t size, const std::string& path) {
  install_sigbus_guard();
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base);
  for (GuardSlot& slot : g_guard) {
    uintptr_t expected = 0;
    // Claimed with a placeholder end first, so the handler never matches a half-written slot.
    if (!slot.end.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
    std::snprintf(slot.path, sizeof slot.path, "%s", path.c_str());
    slot.truncated.store(0, std::memory_order_relaxed);
    slot.begin.store(begin, std::memory_order_release);
    slot.end.store((begin + size + page - 1) / page * page, std::memory_order_release);
    return &slot;
  }
  return nullptr;
}

// Read-only private mapping of a whole file. Tensors returned by get() hold a shared_ptr to it.
struct Mapping {
  const uint8_t* base = nullptr;
  size_t size = 0;
  GuardSlot* slot = nullptr;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (slot) {
      slot->begin.store(0, std::memory_order_release);
      slot->end.store(0, std::memory_order_release);
    }
    if (base) munmap(const_cast<uint8_t*>(base), size);
  }
};

struct DtypeName {
  const char* name;
  DType dtype;
};
constexpr DtypeName kDtypes[] = {{"F32", DType::f32}, {"BF16", DType::bf16}, {"F16", DType::f16},
                                 {"I32", DType::i32}, {"I64", DType::i64},   {"I8", DType::i8},
                                 {"U8", DType::u8}};
// Valid safetensors dtypes that tformers does not load.
constexpr const char* kKnownUnsupported[] = {
    "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2",     "F4",         "BOOL",
    "I16", "U16",     "U32",     "U64",     "C64",     "F8_E4M3FNUZ", "F8_E5M2FNUZ"};

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDtypes)
    if (d.dtype == t) return d.name;
  TF_CHECK(false, "no safetensors name for dtype ", int(t));
}

std::string json_type(const Json& v) {
  if (v.is_number_unsigned() || v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number " + v.dump();
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.size() > 32) s = s.substr(0, 29) + "...";
    return "string \"" + s + "\"";
  }
  return v.type_name();
}

// "[json.exception.parse_error.101] parse error at line 1, column 2: what" -> "what".
std::string strip_prefix(const std::string& what) {
  if (what.rfind("[json.exception", 0) != 0) return what;
  size_t p = what.find(": ");
  return p == std::string::npos ? what.substr(what.find(']') + 1) : what.substr(p + 2);
}

// nlohmann's linear DOM builder, watching the top-level keys: it records them in file order (the
// header's order; the document is a sorted map) and catches a duplicated one, which nlohmann
// would silently overwrite although it makes the file ambiguous. Neither an insertion-ordered
// object nor a parser callback will do: each scans the whole object per member, so a header of
// 200,000 tensors took minutes.
class TopLevelKeys : public nlohmann::detail::json_sax_dom_parser<Json> {
  using Dom = nlohmann::detail::json_sax_dom_parser<Json>;

 public:
  explicit TopLevelKeys(Json& root) : Dom(root, /*allow_exceptions=*/true) {}
  // Hide the builder's methods of the same names (sax_parse calls them on this type).
  bool start_object(size_t len) { return ++depth_, Dom::start_object(len); }
  bool end_object() { return --depth_, Dom::end_object(); }
  bool start_array(size_t len) { return ++depth_, Dom::start_array(len); }
  bool end_array() { return --depth_, Dom::end_array(); }
  bool key(std::string& k) {
    if (depth_ == 1) {
      auto [it, fresh] = seen_.insert(k);
      if (fresh)
        order.push_back(&*it);
      else if (duplicate.empty())
        duplicate = k;
    }
    return Dom::key(k);
  }

  std::vector<const std::string*> order;  // into seen_
  std::string duplicate;                  // the first top-level key seen twice

 private:
  int depth_ = 0;
  std::set<std::string> seen_;
};

// Parses and validates one safetensors header. `data_size` is the byte count after the header.
class HeaderParser {
 public:
  HeaderParser(const std::string& path, uint64_t data_start, uint64_t data_size)
      : path_(path), data_start_(data_start), data_size_(data_size) {}

  [[noreturn]] void fail(const std::string& msg) const {
    throw FormatError(str_cat(path_, ": ", msg));
  }

  void parse(const char* text, size_t n, std::vector<TensorInfo>& tensors,
             std::map<std::string, std::string>& metadata) {
    n = strip_padding(text, n);
    check_json_depth(std::string_view(text, n), str_cat(path_, " (header)"));
    Json header;
    TopLevelKeys sax(header);
    try {
      Json::sax_parse(text, text + n, &sax);
    } catch (const Json::parse_error& e) {
      // nlohmann counts bytes read, 1-based; the header starts at file byte 8.
      uint64_t at = 8 + std::min<uint64_t>(e.byte == 0 ? 0 : e.byte - 1, n);
      fail(str_cat("the JSON header (file bytes 8..", 8 + n, ") is malformed at file byte ", at,
                   ": ", strip_prefix(e.what()),
                   "; the file is corrupt or not a safetensors file"));
    } catch (const Json::exception& e) {
      fail(str_cat("the JSON header (file bytes 8..", 8 + n, ") is malformed: ",
                   strip_prefix(e.what()), "; the file is corrupt or not a safetensors file"));
    }
    if (!sax.duplicate.empty())
      fail(str_cat("tensor '", sax.duplicate,
                   "' appears twice in the header; names must be unique"));
    if (!header.is_object())
      fail(str_cat("the JSON header must be an object of tensors, got ", json_type(header)));
    check_object_bounds(text, n);

    tensors.reserve(sax.order.size());
    for (const std::string* key : sax.order) {
      const Json& value = header.find(*key).value();
      if (*key == "__metadata__") {
        parse_metadata(value, metadata);
      } else {
        tensors.push_back(parse_entry(*key, value));
      }
    }
    check_layout(tensors);
  }

 private:
  // The format: the header is a JSON object starting at its first byte, optionally followed by
  // spaces (0x20) only. nlohmann would stop at a NUL (so reject those first, returning the length
  // without the padding) and skip a BOM and other whitespace around the value (so check the
  // first and last bytes once the text is known to be an object).
  size_t strip_padding(const char* text, size_t n) const {
    if (const void* nul = std::memchr(text, '\0', n))
      fail(str_cat("the JSON header has a NUL byte at file byte ",
                   8 + (static_cast<const char*>(nul) - text),
                   "; only spaces may pad the header; the file is corrupt"));
    while (n > 0 && text[n - 1] == ' ') --n;
    return n;
  }

  void check_object_bounds(const char* text, size_t n) const {
    if (text[0] != '{')
      fail(str_cat("the JSON header must start with '{' at file byte 8, found byte 0x",
                   hex_byte(text[0]), uint8_t(text[0]) == 0xEF ? " (a UTF-8 byte-order mark)" : "",
                   "; the file is corrupt or not a safetensors file"));
    if (text[n - 1] != '}')
      fail(str_cat("the JSON header must end with '}' followed only by spaces; found byte 0x",
                   hex_byte(text[n - 1]), " at file byte ", 8 + n - 1,
                   "; the file is corrupt or not a safetensors file"));
  }

  static std::string hex_byte(char c) {
    const char* digits = "0123456789ABCDEF";
    return {digits[uint8_t(c) >> 4], digits[uint8_t(c) & 15]};
  }

  void parse_metadata(const Json& m, std::map<std::string, std::string>& metadata) const {
    if (!m.is_object())
      fail(str_cat("'__metadata__' must be an object of strings, got ", json_type(m)));
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (!it.value().is_string())
        fail(str_cat("'__metadata__' field '", it.key(), "' must be a string, got ",
                     json_type(it.value())));
      metadata[it.key()] = it.value().get<std::string>();
    }
  }

  TensorInfo parse_entry(const std::string& name, const Json& e) const {
    auto where = [&] { return str_cat("tensor '", name, "'"); };
    if (!e.is_object())
      fail(str_cat(where(), ": entry must be an object {dtype, shape, data_offsets}, got ",
                   json_type(e)));
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!e.contains(field)) fail(str_cat(where(), ": field '", field, "' is missing"));

    TensorInfo info;
    info.name = name;
    info.file = path_;

    const Json& dt = e["dtype"];
    if (!dt.is_string()) fail(str_cat(where(), ": 'dtype' must be a string, got ", json_type(dt)));
    const std::string& dts = dt.get_ref<const std::string&>();
    bool found = false;
    for (const auto& d : kDtypes)
      if (dts == d.name) info.dtype = d.dtype, found = true;
    if (!found) {
      for (const char* u : kKnownUnsupported)
        if (dts == u)
          fail(str_cat(where(), ": dtype '", dts, "' is not supported by tformers (supported: ",
                       kSupportedDtypes, "); convert the checkpoint to bfloat16 or float32"));
      std::string shown = dts.size() > 32 ? dts.substr(0, 29) + "..." : dts;
      fail(str_cat(where(), ": unknown dtype '", shown, "' (supported: ", kSupportedDtypes, ")"));
    }

    const Json& sh = e["shape"];
    if (!sh.is_array())
      fail(str_cat(where(), ": 'shape' must be an array of integers, got ", json_type(sh)));
    uint64_t numel = 1;
    for (size_t i = 0; i < sh.size(); ++i) {
      const Json& d = sh[i];
      if (!d.is_number_integer() && !d.is_number_unsigned())
        fail(str_cat(where(), ": shape[", i, "] must be a non-negative integer, got ",
                     json_type(d)));
      if (!d.is_number_unsigned() && d.get<int64_t>() < 0)
        fail(str_cat(where(), ": shape[", i, "] = ", d.get<int64_t>(), " is negative"));
      uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel))
        fail(str_cat(where(), ": shape ", sh.dump(), " has more elements than fit in 64 bits"));
      info.shape.push_back(int64_t(dim));
    }
    uint64_t nbytes = 0;
    if (numel > uint64_t(INT64_MAX) ||
        __builtin_mul_overflow(numel, dtype_size(info.dtype), &nbytes))
      fail(str_cat(where(), ": shape ", sh.dump(), " of ", dts, " is larger than 2^64 bytes"));

    const Json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2)
      fail(str_cat(where(), ": 'data_offsets' must be an array [begin, end], got ",
                   off.is_array() ? str_cat("an array of ", off.size()) : json_type(off)));
    uint64_t be[2];
    for (int i = 0; i < 2; ++i) {
      if (!off[i].is_number_unsigned())
        fail(str_cat(where(), ": data_offsets[", i, "] must be a non-negative integer, got ",
                     off[i].is_number_integer() ? off[i].dump() : json_type(off[i])));
      be[i] = off[i].get<uint64_t>();
    }
    uint64_t begin = be[0], end = be[1];
    if (begin > end)
      fail(str_cat(where(), ": data_offsets [", begin, ", ", end, "] has begin > end"));
    if (end > data_size_)
      fail(str_cat(where(), ": data_offsets [", begin, ", ", end,
                   "] run past the end of the data buffer (", data_size_, " bytes, file bytes ",
                   data_start_, "..", data_start_ + data_size_,
                   "); the file is truncated or the header is corrupt"));
    if (end - begin != nbytes)
      fail(str_cat(where(), ": data_offsets [", begin, ", ", end, "] hold ", end - begin,
                   " bytes but shape ", shape_str(info.shape), " of ", dts, " needs ", numel, " x ",
                   dtype_size(info.dtype), " = ", nbytes, " bytes"));
    info.offset = data_start_ + begin;
    info.nbytes = nbytes;
    return info;
  }

  // Tensors must tile the data buffer exactly: no overlap, no hole, nothing after the last.
  // That is what the reference implementation (safetensors' Rust core, used by Transformers)
  // accepts, so a file that passes here loads there and vice versa.
  void check_layout(const std::vector<TensorInfo>& tensors) const {
    std::vector<size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), 0);
    auto begin_of = [&](size_t i) { return tensors[i].offset - data_start_; };
    auto end_of = [&](size_t i) { return begin_of(i) + tensors[i].nbytes; };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return begin_of(a) != begin_of(b) ? begin_of(a) < begin_of(b) : end_of(a) < end_of(b);
    });
    uint64_t pos = 0;
    size_t prev = 0;
    for (size_t i : order) {
      const TensorInfo& t = tensors[i];
      uint64_t b = begin_of(i), e = end_of(i);
      if (b < pos)
        fail(str_cat("tensors '", tensors[prev].name, "' (data_offsets [", begin_of(prev), ", ",
                     pos, "]) and '", t.name, "' (data_offsets [", b, ", ", e,
                     "]) overlap; the header is corrupt"));
      if (b > pos)
        fail(str_cat("data bytes [", pos, ", ", b, ") (file offset ", data_start_ + pos,
                     ") before tensor '", t.name,
                     "' belong to no tensor; safetensors requires tensors packed back to back "
                     "(the reference library rejects this file too): re-save it with "
                     "safetensors.torch.save_file"));
      pos = e;
      prev = i;
    }
    if (pos != data_size_)
      fail(str_cat("the data buffer is ", data_size_, " bytes but the tensors end at ", pos,
                   " (file offset ", data_start_ + pos,
                   "); trailing bytes belong to no tensor: the file is corrupt or was "
                   "appended to"));
  }

  const std::string& path_;
  uint64_t data_start_;
  uint64_t data_size_;
};

}  // namespace

struct SafetensorsFile::Impl {
  std::string path;
  std::shared_ptr<const Mapping> mapping;
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  std::unordered_map<std::string, size_t> by_name;

  // A view of `nbytes` at absolute file offset `offset`. safetensors does not align tensors, so
  // a view whose address is not a multiple of the element size is copied into aligned memory:
  // consumers may always assume element alignment.
  Tensor view(Shape shape, DType dtype, uint64_t offset, uint64_t nbytes) const {
    const uint8_t* p = mapping->base + offset;
    if (reinterpret_cast<uintptr_t>(p) % dtype_size(dtype) != 0) {
      Tensor t = Tensor::zeros(std::move(shape), dtype);
      if (nbytes) std::memcpy(t.raw(), p, nbytes);
      return t;
    }
    std::shared_ptr<const void> owner = mapping;
    return Tensor::borrow(std::move(shape), dtype, const_cast<uint8_t*>(p), std::move(owner));
  }
};

SafetensorsFile::~SafetensorsFile() = default;

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  RegularFile file(path, kMaxSafetensorsBytes, "safetensors file");
  uint64_t size = file.size();
  if (size < 8) {
    throw FormatError(str_cat(path, ": file is ", size,
                              " bytes, shorter than the 8-byte header length that starts every "
                              "safetensors file; it is truncated or not a safetensors file"));
  }
  auto mapping = std::make_shared<Mapping>();
  // Only the header pages are read here; tensor data is paged in when first used.
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  int err = errno;
  if (p == MAP_FAILED) throw Error(str_cat(path, ": mmap failed: ", std::strerror(err)));
  mapping->base = static_cast<const uint8_t*>(p);
  mapping->size = size;
  mapping->slot = guard(mapping->base, size, path);

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | mapping->base[i];
  if (n > size - 8)
    throw FormatError(
        str_cat(path, ": header length ", n, " (bytes 0..8) runs past the end of the ", size,
                "-byte file (header would end at byte ", n > UINT64_MAX - 8 ? UINT64_MAX : n + 8,
                "); the file is truncated or not a safetensors file"));
  if (n > kMaxHeaderBytes)
    throw FormatError(str_cat(path, ": header length ", n, " is larger than the ", kMaxHeaderBytes,
                              "-byte limit; the file is corrupt"));

  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->impl_ = std::make_unique<Impl>();
  Impl& impl = *f->impl_;
  impl.path = path;
  impl.mapping = mapping;
  HeaderParser parser(impl.path, 8 + n, size - 8 - n);
  parser.parse(reinterpret_cast<const char*>(mapping->base + 8), size_t(n), impl.tensors,
               impl.metadata);
  for (size_t i = 0; i < impl.tensors.size(); ++i) impl.by_name[impl.tensors[i].name] = i;
  return f;
}

void check_mapped_files() {
  if (!g_any_truncated.load(std::memory_order_acquire)) return;
  for (const GuardSlot& slot : g_guard) {
    if (!slot.truncated.load(std::memory_order_acquire) ||
        slot.begin.load(std::memory_order_acquire) == 0)
      continue;
    const std::string path = slot.path;
    std::error_code ec;
    const uintmax_t now = fs::file_size(path, ec);
    throw IoError(str_cat(
        path, ": the file shrank while tformers was reading it",
        ec ? std::string() : str_cat(" (it is ", now, " bytes now, less than its header says)"),
        "; the weights past its end read as zeros, so the model cannot be trusted. Do not "
        "truncate or rewrite a checkpoint while it is loaded or, under --load-mode mmap, "
        "served; replace it by writing a new file and renaming it over the old one"));
  }
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::vector<TensorInfo>& SafetensorsFile::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = impl_->by_name.find(name);
  return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

namespace {

[[noreturn]] void no_such_tensor(const std::string& where, const std::string& name,
                                 const std::vector<std::string>& names) {
  std::string msg = str_cat(where, ": no tensor named '", name, "'");
  if (names.empty()) {
    msg += " (it holds no tensors)";
  } else {
    msg += str_cat(" (it holds ", names.size(), ": ");
    for (size_t i = 0; i < names.size() && i < 5; ++i) msg += (i ? ", " : "") + names[i];
    msg += names.size() > 5 ? ", ...)" : ")";
  }
  throw NotFoundError(msg);
}

void check_rows(const TensorInfo& info, int64_t row_begin, int64_t row_end) {
  if (info.shape.empty())
    throw InvalidArgumentError(str_cat(info.file, ": tensor '", info.name,
                                       "' is a scalar; get_rows needs at least one dimension"));
  if (row_begin < 0 || row_begin > row_end || row_end > info.shape[0])
    throw InvalidArgumentError(str_cat(info.file, ": tensor '", info.name, "' of shape ",
                                       shape_str(info.shape), ": rows [", row_begin, ", ", row_end,
                                       ") are not a range within [0, ", info.shape[0], "]"));
}

}  // namespace

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info) {
    std::vector<std::string> names;
    for (const auto& t : impl_->tensors) names.push_back(t.name);
    no_such_tensor(impl_->path, name, names);
  }
  return impl_->view(info->shape, info->dtype, info->offset, info->nbytes);
}

Tensor SafetensorsFile::get_rows(const std::string& name, int64_t row_begin,
                                 int64_t row_end) const {
  const TensorInfo* info = find(name);
  if (!info) {
    std::vector<std::string> names;
    for (const auto& t : impl_->tensors) names.push_back(t.name);
    no_such_tensor(impl_->path, name, names);
  }
  check_rows(*info, row_begin, row_end);
  Shape shape = info->shape;
  // The row size is exact: nbytes == shape[0] * row_bytes (validated at open).
  uint64_t row_bytes = shape[0] == 0 ? 0 : info->nbytes / uint64_t(shape[0]);
  shape[0] = row_end - row_begin;
  return impl_->view(std::move(shape), info->dtype, info->offset + uint64_t(row_begin) * row_bytes,
                     uint64_t(row_end - row_begin) * row_bytes);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  return detail::with_tformers_errors(str_cat("opening the checkpoint ", dir), [&] {
    Checkpoint ckpt;
    ckpt.dir_ = dir;
    std::error_code ec;
    auto add_file = [&](std::shared_ptr<SafetensorsFile> f) {
      size_t fi = ckpt.files_.size();
      for (const auto& t : f->tensors()) {
        auto [it, inserted] = ckpt.index_.emplace(t.name, fi);
        if (!inserted)
          throw FormatError(str_cat(dir, ": tensor '", t.name, "' is in both ",
                                    ckpt.files_[it->second]->path(), " and ", f->path(),
                                    "; a tensor must live in exactly one shard"));
      }
      ckpt.files_.push_back(std::move(f));
    };

    if (fs::is_regular_file(dir, ec)) {  // a single .safetensors file given directly
      add_file(SafetensorsFile::open(dir));
      return ckpt;
    }
    if (!fs::is_directory(dir, ec))
      throw NotFoundError(str_cat("model folder '", dir, "' does not exist"));

    // Weight files may be links to another disk (the folder's owner put them there); the
    // index's names still may not lead out of the folder through a linked subfolder.
    std::string single = resolve_inside(dir, kSingleName, dir, /*file_may_link_out=*/true);
    std::string index = (fs::path(dir) / kIndexName).string();
    // Transformers prefers the single file when both exist; so do we.
    if (fs::exists(single, ec)) {
      add_file(SafetensorsFile::open(single));
      return ckpt;
    }
    if (!fs::exists(index, ec)) {
      std::string msg = str_cat("no weights in '", dir, "': looked for ", single, " and ", index);
      std::vector<std::string> others;
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        std::string name = e.path().filename().string();
        if (name.ends_with(".safetensors") || name.ends_with(".bin") || name.ends_with(".gguf") ||
            name.ends_with(".pt") || name.ends_with(".pth"))
          others.push_back(name);
      }
      std::sort(others.begin(), others.end());
      if (!others.empty()) {
        msg += "; the folder has ";
        for (size_t i = 0; i < others.size() && i < 8; ++i) msg += (i ? ", " : "") + others[i];
        if (others.size() > 8) msg += ", ...";
        msg +=
            " (tformers reads model.safetensors or a sharded index; convert other formats with "
            "Transformers' save_pretrained(..., safe_serialization=True))";
      }
      throw NotFoundError(msg);
    }

    Json idx = load_json_file(index, kMaxIndexJsonBytes);
    if (!idx.is_object()) throw FormatError(str_cat(index, ": expected a JSON object"));
    auto wm = idx.find("weight_map");
    if (wm == idx.end())
      throw FormatError(str_cat(index, ": required field 'weight_map' is missing"));
    if (!wm->is_object() || wm->empty())
      throw FormatError(
          str_cat(index, ": 'weight_map' must be a non-empty object {tensor: shard}"));

    // Shards in order of first mention, each opened once.
    std::vector<std::string> shards;
    std::map<std::string, std::pair<std::string, size_t>> first_use;  // shard -> (tensor, count)
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string())
        throw FormatError(
            str_cat(index, ": weight_map[\"", it.key(), "\"] must be a shard file name (string)"));
      const std::string& shard = it.value().get_ref<const std::string&>();
      auto [u, fresh] = first_use.emplace(shard, std::make_pair(it.key(), size_t(0)));
      ++u->second.second;
      if (fresh) shards.push_back(shard);
    }
    std::map<std::string, size_t> shard_file;
    for (const auto& shard : shards) {
      // Checked once per shard, naming the first tensor that uses it.
      std::string p = resolve_inside(
          dir, shard, str_cat(index, ": weight_map[\"", first_use[shard].first, "\"]"),
          /*file_may_link_out=*/true);
      if (!fs::exists(p, ec)) {
        const auto& [tensor, count] = first_use[shard];
        throw NotFoundError(str_cat(index, ": shard '", shard, "' (holding '", tensor, "'",
                                    count > 1 ? str_cat(" and ", count - 1, " more tensors") : "",
                                    ") is missing: ", p,
                                    " does not exist; download the complete checkpoint"));
      }
      shard_file[shard] = ckpt.files_.size();
      add_file(SafetensorsFile::open(p));
    }
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      const std::string& shard = it.value().get_ref<const std::string&>();
      const auto& f = ckpt.files_[shard_file[shard]];
      if (!f->find(it.key())) {
        auto where = ckpt.index_.find(it.key());
        throw FormatError(str_cat(
            index, ": weight_map says tensor '", it.key(), "' is in ", shard, " but ", f->path(),
            " has no such tensor",
            where != ckpt.index_.end()
                ? str_cat(" (it is in ", ckpt.files_[where->second]->path(), "; fix the index)")
                : "; the index and the shards do not match"));
      }
    }
    return ckpt;
  });
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, fi] : index_) out.push_back(name);
  return out;  // std::map keeps them sorted
}

bool Checkpoint::has(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) no_such_tensor(str_cat("checkpoint '", dir_, "'"), name, names());
  return *files_[it->second]->find(name);
}

Tensor Checkpoint::get(const std::string& name) const {
  const TensorInfo& i = info(name);
  return files_[index_.at(name)]->get(i.name);
}

Tensor Checkpoint::get_rows(const std::string& name, int64_t row_begin, int64_t row_end) const {
  info(name);
  return files_[index_.at(name)]->get_rows(name, row_begin, row_end);
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_)
    for (const auto& t : f->tensors()) total += t.nbytes;
  return total;
}

// ---------------------------------------------------------------------------------------------
// Writing

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw InvalidArgumentError(
          str_cat("save_safetensors(", path, "): invalid tensor name '", name, "'"));
    if (!names.insert(name).second)
      throw InvalidArgumentError(
          str_cat("save_safetensors(", path, "): tensor '", name, "' given twice"));
    if (!t.defined())
      throw InvalidArgumentError(
          str_cat("save_safetensors(", path, "): tensor '", name, "' has no data"));
    if (t.device().type != "cpu")
      throw InvalidArgumentError(str_cat("save_safetensors(", path, "): tensor '", name, "' is on ",
                                         t.device().str(), ", not on the host"));
  }
  // Larger elements first (stable otherwise): every tensor then starts at a multiple of its
  // element size with no padding between tensors, which the format does not allow.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(tensors[a].second.dtype()) > dtype_size(tensors[b].second.dtype());
  });

  // The header is written member by member, in this order: an insertion-ordered JSON object
  // would look each new name up by a linear scan, quadratic over many tensors.
  std::string text = "{";
  auto member = [&](const std::string& name, const OrderedJson& value) {
    if (text.size() > 1) text += ',';
    text += OrderedJson(name).dump() + ':' + value.dump();
  };
  if (!metadata.empty()) member("__metadata__", OrderedJson(metadata));
  uint64_t pos = 0;
  for (size_t i : order) {
    const auto& [name, t] = tensors[i];
    OrderedJson e;
    e["dtype"] = safetensors_dtype_name(t.dtype());
    e["shape"] = t.shape();
    e["data_offsets"] = {pos, pos + t.nbytes()};
    pos += t.nbytes();
    member(name, e);
  }
  text += '}';
  // Pad with spaces so the data buffer starts 8-byte aligned in the file (and in the mapping).
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  // Written to a temporary name and renamed, so a crash never leaves a truncated checkpoint.
  std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error(str_cat("save_safetensors: cannot create ", tmp, ": ", std::strerror(errno)));
  auto fail = [&](const char* what) {
    int err = errno;
    std::fclose(f);
    std::remove(tmp.c_str());
    throw Error(str_cat("save_safetensors: ", what, " ", tmp, ": ", std::strerror(err)));
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  if (std::fwrite(len, 1, 8, f) != 8 || std::fwrite(text.data(), 1, text.size(), f) != text.size())
    fail("cannot write");
  for (size_t i : order) {
    const Tensor& t = tensors[i].second;
    if (t.nbytes() && std::fwrite(t.raw(), 1, t.nbytes(), f) != t.nbytes()) fail("cannot write");
  }
  if (std::fflush(f) != 0) fail("cannot write");
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    throw Error(str_cat("save_safetensors: cannot write ", tmp, ": ", std::strerror(errno)));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error(str_cat("save_safetensors: cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
}

}  // namespace tformers::io
