// A client for PJRT C-API plugins (XLA's CPU and CUDA runtimes, libtpu): load a plugin, create a
// client, upload buffers, compile StableHLO text, execute, read results back. Every PJRT_Error
// becomes a tformers::Error quoting the plugin's message and the call that failed; every handle
// is owned by an RAII object, and buffers and executables keep their client alive, so handles
// are always destroyed before the client that made them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "backends/pjrt/c_api.h"

namespace tformers::backends::pjrt {

// Element types, numbered as PJRT_Buffer_Type. Host bf16 is its raw 16 bits.
enum class ElementType : int {
  kPred = 1,
  kS8 = 2,
  kS32 = 4,
  kS64 = 5,
  kU8 = 6,
  kF16 = 10,
  kF32 = 11,
  kBF16 = 13,
};
size_t element_size(ElementType type);
std::string_view element_type_name(ElementType type);

// A loaded and initialized plugin. Plugins are loaded once per process and never unloaded: the
// function table and every handle live inside the library.
class Plugin {
 public:
  // Loads the plugin at `path` (once; later calls return the same object). Throws NotFoundError
  // when there is no such file and DeviceError or UnsupportedError when it is not a usable PJRT
  // plugin, naming the path.
  static const Plugin& load(const std::string& path);

  const std::string& path() const { return path_; }
  int api_major() const { return api_major_; }
  int api_minor() const { return api_minor_; }
  // From PJRT_Plugin_Attributes; -1 / {-1, -1, -1} when the plugin does not report one.
  int64_t xla_version() const { return xla_version_; }
  const std::array<int64_t, 3>& stablehlo_current_version() const { return stablehlo_current_; }
  const std::array<int64_t, 3>& stablehlo_minimum_version() const { return stablehlo_minimum_; }

  // Calls function `fn` of the table with `args`; throws if the plugin reports an error.
  template <typename Args>
  void call(capi::Fn fn, Args& args) const {
    check(raw_call(fn, args), capi::fn_name(fn));
  }
  // Calls `fn` and returns its error, which the caller must check() or destroy.
  template <typename Args>
  capi::PJRT_Error* raw_call(capi::Fn fn, Args& args) const {
    using Function = capi::PJRT_Error* (*)(Args*);
    const auto f = reinterpret_cast<Function>(function(fn));
    try {
      return f(&args);
    } catch (const std::exception& e) {
      // Seen from XLA's CPU plugin: a create option of the wrong type throws
      // std::bad_variant_access through the C API instead of returning a PJRT_Error.
      plugin_threw(fn, e);
    }
  }
  // For destructors, which must not throw: a failure is printed to stderr and dropped.
  template <typename Args>
  void release(capi::Fn fn, Args& args) const noexcept {
    try {
      call(fn, args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tformers: %s\n", e.what());
    }
  }
  // Turns a PJRT_Error from `call` into a thrown tformers::Error (and destroys it); nothing when
  // null.
  void check(capi::PJRT_Error* error, std::string_view call) const;
  // Awaits and destroys an event; throws the event's error, if any.
  void await(capi::PJRT_Event* event, capi::Fn produced_by) const;

 private:
  Plugin(std::string path, const capi::PJRT_Api* api);
  void* function(capi::Fn fn) const;
  void destroy_error(capi::PJRT_Error* error) const;
  [[noreturn]] void plugin_threw(capi::Fn fn, const std::exception& e) const;

  std::string path_;
  const capi::PJRT_Api* api_;
  int api_major_;
  int api_minor_;
  int64_t xla_version_ = -1;
  std::array<int64_t, 3> stablehlo_current_{-1, -1, -1};
  std::array<int64_t, 3> stablehlo_minimum_{-1, -1, -1};
};

// A client creation option, passed to the plugin as a PJRT_NamedValue.
struct ClientOption {
  std::string name;
  std::variant<std::string, int64_t, std::vector<int64_t>, float, bool> value;
};

struct Device {
  capi::PJRT_Device* handle;
  int id;            // global id
  std::string kind;  // e.g. "cpu", "NVIDIA H200"
};

class Client;
class LoadedExecutable;

struct ParameterType {
  ElementType type;
  std::vector<int64_t> dims;
};

namespace detail {
struct ClientState;  // the PJRT_Client and what was read from it, shared by its objects
[[noreturn]] void host_type_mismatch(size_t host_size, ElementType type);
}  // namespace detail

// A buffer on a device. Move-only.
class Buffer {
 public:
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  ElementType element_type() const;
  std::vector<int64_t> dims() const;
  // True once the buffer was donated to an execution (its storage now belongs to an output).
  bool is_deleted() const;
  // The contents, dense and row-major.
  std::vector<std::byte> to_host() const;
  // The contents as T, which must have the element type's size (uint16_t for bf16).
  template <typename T>
  std::vector<T> to_host_as() const {
    std::vector<std::byte> bytes = to_host();
    check_host_type(sizeof(T));
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

 private:
  friend class Client;
  friend class LoadedExecutable;
  Buffer(std::shared_ptr<const detail::ClientState> client, capi::PJRT_Buffer* handle);
  void check_host_type(size_t host_element_size) const;
  capi::PJRT_Buffer* handle() const;  // throws when moved-from
  const Plugin& plugin() const;

  std::shared_ptr<const detail::ClientState> client_;
  capi::PJRT_Buffer* handle_ = nullptr;
};

// A compiled program loaded on the client's devices. Move-only.
class LoadedExecutable {
 public:
  LoadedExecutable(LoadedExecutable&& other) noexcept;
  LoadedExecutable& operator=(LoadedExecutable&& other) noexcept;
  LoadedExecutable(const LoadedExecutable&) = delete;
  LoadedExecutable& operator=(const LoadedExecutable&) = delete;
  ~LoadedExecutable();

  size_t num_outputs() const { return num_outputs_; }
  // Runs the program on one device with `args` in @main's parameter order and waits for it.
  // Arguments are checked against @main's parameter types when compile() could read them.
  // Arguments marked donated in the module (tf.aliasing_output) read as deleted afterwards.
  std::vector<Buffer> execute(const std::vector<const Buffer*>& args) const;
  // The plugin's serialization of the compiled program, which Client::deserialize of the same
  // plugin build loads again; it need not be stable across builds.
  std::string serialize() const;

 private:
  friend class Client;
  LoadedExecutable(std::shared_ptr<const detail::ClientState> client,
                   capi::PJRT_LoadedExecutable* h);

  std::shared_ptr<const detail::ClientState> client_;
  capi::PJRT_LoadedExecutable* handle_ = nullptr;
  size_t num_outputs_ = 0;
  std::optional<std::vector<ParameterType>> parameters_;  // of @main, when its text was read
};

// Device memory an executable needs, as its compiler planned it.
struct CompiledMemoryStats {
  int64_t generated_code_bytes = 0;
  int64_t argument_bytes = 0;
  int64_t output_bytes = 0;
  int64_t alias_bytes = 0;  // of the arguments, reused by outputs: donated state
  int64_t temp_bytes = 0;
  int64_t peak_bytes = 0;
};

// A program compiled for a topology: what it will need of a device of that topology.
struct CompiledProgram {
  CompiledMemoryStats memory;
  // The plugin's cost analysis ("flops", "bytes accessed", ...), as it names the properties;
  // empty when it offers none.
  std::vector<std::pair<std::string, double>> cost;
};

// Checks a topology name before libtpu parses it (libtpu divides by the dimensions: "v5e:0x0"
// ended the process with SIGFPE): GENERATION:AxB or GENERATION:AxBxC, a TPU generation
// libtpu knows and every dimension from 1 to 4096. InvalidArgumentError naming the part at fault.
void check_topology_name(const std::string& name);

// The HBM of one chip of a topology's TPU generation (a checked name), as Google's Cloud TPU
// documentation gives it: 16 GiB for v2 and v5e, 32 GiB for v3, v4 and v6e, 95 GiB for v5p, 192
// GiB for tpu7x (Ironwood). What a one-chip program may use at its peak.
int64_t chip_hbm_bytes(const std::string& topology);

// Devices described by name rather than found: compiling for a topology needs no device, which
// is how libtpu compiles for a TPU slice ("v5e:2x2") on any x86 host, as JAX's ahead-of-time
// compilation does. Move-only.
class Topology {
 public:
  // InvalidArgumentError (or the plugin's error) quoting the plugin when it does not know `name`.
  Topology(const Plugin& plugin, const std::string& name,
           const std::vector<ClientOption>& options = {});
  Topology(Topology&& other) noexcept;
  Topology& operator=(Topology&&) = delete;
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  ~Topology();

  const Plugin& plugin() const { return *plugin_; }
  const std::string& name() const { return name_; }
  const std::string& platform_name() const { return platform_name_; }  // "tpu"
  // Compiles a StableHLO module (entry @main) for one device of the topology.
  CompiledProgram compile(std::string_view mlir) const;

 private:
  void destroy() noexcept;

  const Plugin* plugin_;
  capi::PJRT_TopologyDescription* handle_ = nullptr;
  std::string name_;
  std::string platform_name_;
};

class Client {
 public:
  explicit Client(const Plugin& plugin, const std::vector<ClientOption>& options = {});

  const Plugin& plugin() const;
  const std::string& platform_name() const;    // "cpu", "cuda", "tpu"
  const std::vector<Device>& devices() const;  // the addressable ones

  // Copies `bytes` (dense, row-major, `dims`) to `device` (the first one when null).
  Buffer buffer_from_host(const void* data, size_t bytes, ElementType type,
                          const std::vector<int64_t>& dims, const Device* device = nullptr) const;
  template <typename T>
  Buffer buffer_from_host(const std::vector<T>& data, ElementType type,
                          const std::vector<int64_t>& dims) const {
    if (sizeof(T) != element_size(type)) detail::host_type_mismatch(sizeof(T), type);
    return buffer_from_host(data.data(), data.size() * sizeof(T), type, dims);
  }

  // Compiles a StableHLO module in MLIR text (entry function @main) for one replica and one
  // partition.
  LoadedExecutable compile(std::string_view mlir) const;
  // An executable from LoadedExecutable::serialize, compiled from `mlir` (whose @main gives the
  // parameter types execute checks). The plugin's error when the bytes are not its own.
  LoadedExecutable deserialize(std::string_view bytes, std::string_view mlir) const;
  // What decides a compiled program's bytes besides its module: the plugin file and its
  // versions, the platform's version, the devices' kinds and the compile options. Serialized
  // executables are reused only under the same identity.
  const std::string& build_identity() const;

 private:
  std::shared_ptr<const detail::ClientState> shared_;
};

}  // namespace tformers::backends::pjrt
