#include "backends/pjrt/pjrt_api.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "io/shared_library.h"
#include "tformers/error.h"

namespace tformers::backends::pjrt {

using ::tformers::detail::str_cat;

namespace {

// absl::StatusCode names, as the plugin's errors carry them.
const char* code_name(int code) {
  static const char* const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  return code >= 0 && code < int(std::size(names)) ? names[code] : "UNKNOWN";
}

[[noreturn]] void throw_for_code(int code, const std::string& msg) {
  switch (code) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE
      throw InvalidArgumentError(msg);
    case 5:
      throw NotFoundError(msg);
    case 8:
      throw ResourceError(msg);
    case 12:
      throw UnsupportedError(msg);
    default:
      throw DeviceError(msg);
  }
}

// xla::CompileOptionsProto{executable_build_options{num_replicas: 1, num_partitions: 1}},
// serialized by hand (the core links no protobuf library): field 3, length-delimited (0x1a) and
// 4 bytes long, holding varint fields 4 (0x20) and 5 (0x28), each 1.
constexpr char kCompileOptions[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01};

// A StableHLO module in MLIR text as the program Compile reads.
capi::PJRT_Program mlir_program(std::string_view mlir) {
  auto program = capi::make<capi::PJRT_Program>();
  // The plugin only reads the code when compiling; the field is non-const because other calls
  // write serialized programs into it.
  program.code = const_cast<char*>(mlir.data());
  program.code_size = mlir.size();
  program.format = "mlir";
  program.format_size = 4;
  return program;
}

// "f32[2,4]"
std::string shape_string(ElementType type, const std::vector<int64_t>& dims) {
  std::string s(element_type_name(type));
  s += '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(dims[i]);
  }
  return s + ']';
}

std::optional<ElementType> mlir_element_type(std::string_view t) {
  static const std::pair<std::string_view, ElementType> types[] = {
      {"i1", ElementType::kPred}, {"i8", ElementType::kS8},    {"ui8", ElementType::kU8},
      {"i32", ElementType::kS32}, {"i64", ElementType::kS64},  {"f16", ElementType::kF16},
      {"f32", ElementType::kF32}, {"bf16", ElementType::kBF16}};
  for (const auto& [name, type] : types)
    if (t == name) return type;
  return std::nullopt;
}

// The parameter types of @main, read from the pretty form
// `@main(%a: tensor<4x64xbf16> {attrs}, %b: tensor<i32>)`; nullopt for any other spelling (the
// generic form, dynamic dimensions, encodings). XLA's CPU plugin runs a buffer of the right size
// but the wrong dimensions without complaint, so execute() checks arguments against these.
std::optional<std::vector<ParameterType>> main_parameters(std::string_view mlir) {
  size_t at = mlir.find("@main(");
  if (at == std::string_view::npos) return std::nullopt;
  at += 6;
  auto skip_space = [&] {
    while (at < mlir.size() && std::isspace(static_cast<unsigned char>(mlir[at]))) ++at;
  };
  std::vector<ParameterType> params;
  for (;;) {
    skip_space();
    if (at < mlir.size() && mlir[at] == ')') return params;
    if (at >= mlir.size() || mlir[at] != '%') return std::nullopt;
    const size_t colon = mlir.find(':', at);
    if (colon == std::string_view::npos) return std::nullopt;
    at = colon + 1;
    skip_space();
    if (mlir.substr(at, 7) != "tensor<") return std::nullopt;
    const size_t close = mlir.find('>', at);
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view spec = mlir.substr(at + 7, close - at - 7);  // "4x64xbf16" or "i32"
    at = close + 1;
    ParameterType p;
    for (size_t x; (x = spec.find('x')) != std::string_view::npos; spec.remove_prefix(x + 1)) {
      int64_t d = 0;
      auto [end, ec] = std::from_chars(spec.data(), spec.data() + x, d);
      if (ec != std::errc() || end != spec.data() + x) return std::nullopt;
      p.dims.push_back(d);
    }
    std::optional<ElementType> type = mlir_element_type(spec);
    if (!type) return std::nullopt;
    p.type = *type;
    params.push_back(std::move(p));
    skip_space();
    if (at < mlir.size() && mlir[at] == '{') {  // argument attributes: skip, braces balanced
      for (int depth = 0; at < mlir.size(); ++at) {
        depth += mlir[at] == '{' ? 1 : mlir[at] == '}' ? -1 : 0;
        if (depth == 0) break;
      }
      ++at;
      skip_space();
    }
    if (at < mlir.size() && mlir[at] == ',') ++at;
  }
}

// The options as PJRT_NamedValues, which point into `options`.
std::vector<capi::PJRT_NamedValue> named_values(const std::vector<ClientOption>& options) {
  std::vector<capi::PJRT_NamedValue> values;
  for (const ClientOption& o : options) {
    auto v = capi::make<capi::PJRT_NamedValue>();
    v.name = o.name.data();
    v.name_size = o.name.size();
    v.value_size = 1;
    if (const auto* s = std::get_if<std::string>(&o.value)) {
      v.type = capi::PJRT_NamedValue_kString;
      v.string_value = s->data();
      v.value_size = s->size();
    } else if (const auto* i = std::get_if<int64_t>(&o.value)) {
      v.type = capi::PJRT_NamedValue_kInt64;
      v.int64_value = *i;
    } else if (const auto* l = std::get_if<std::vector<int64_t>>(&o.value)) {
      v.type = capi::PJRT_NamedValue_kInt64List;
      v.int64_array_value = l->data();
      v.value_size = l->size();
    } else if (const auto* f = std::get_if<float>(&o.value)) {
      v.type = capi::PJRT_NamedValue_kFloat;
      v.float_value = *f;
    } else {
      v.type = capi::PJRT_NamedValue_kBool;
      v.bool_value = std::get<bool>(o.value);
    }
    values.push_back(v);
  }
  return values;
}

}  // namespace

namespace detail {

struct ClientState {
  const Plugin* plugin;
  capi::PJRT_Client* client = nullptr;
  std::string platform_name;
  std::vector<Device> devices;
  std::string build_identity;  // Client::build_identity(), made once at creation

  ClientState(const Plugin& p, capi::PJRT_Client* c) : plugin(&p), client(c) {}
  ClientState(const ClientState&) = delete;
  ClientState& operator=(const ClientState&) = delete;
  ~ClientState() {
    auto a = capi::make<capi::PJRT_Client_Destroy_Args>();
    a.client = client;
    plugin->release(capi::Fn::Client_Destroy, a);
  }
};

}  // namespace detail

size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::kPred:
    case ElementType::kS8:
    case ElementType::kU8:
      return 1;
    case ElementType::kF16:
    case ElementType::kBF16:
      return 2;
    case ElementType::kS32:
    case ElementType::kF32:
      return 4;
    case ElementType::kS64:
      return 8;
  }
  throw InvalidArgumentError(str_cat("PJRT element type ", int(type), " is not one tformers uses"));
}

std::string_view element_type_name(ElementType type) {
  switch (type) {
    case ElementType::kPred:
      return "pred";
    case ElementType::kS8:
      return "s8";
    case ElementType::kU8:
      return "u8";
    case ElementType::kF16:
      return "f16";
    case ElementType::kBF16:
      return "bf16";
    case ElementType::kS32:
      return "s32";
    case ElementType::kF32:
      return "f32";
    case ElementType::kS64:
      return "s64";
  }
  return "unknown";
}

// ---- Plugin ----

const Plugin& Plugin::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw NotFoundError(
        str_cat("PJRT plugin ", path, ": no such file; pass the path of a PJRT plugin library"));
  const std::string key = std::filesystem::canonical(path).string();
  static std::mutex mu;
  // Never destroyed, as the libraries are never unloaded: buffers and executables call through
  // their Plugin when they are destroyed, and those held by static objects (the process-wide
  // compile cache) are destroyed at exit, in an order this file does not control.
  static auto* loaded = new std::map<std::string, std::unique_ptr<Plugin>>;
  std::lock_guard lock(mu);
  if (auto it = loaded->find(key); it != loaded->end()) return *it->second;

  try {
    io::check_shared_library(key);
  } catch (const FormatError& e) {
    throw DeviceError(str_cat("cannot load PJRT plugin ", path, ": ", e.what()));
  }
  // Never dlclose'd: the function table and every object the plugin hands out live inside it.
  void* lib = ::dlopen(key.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw DeviceError(str_cat("cannot load PJRT plugin ", path, ": ", ::dlerror()));
  using GetPjrtApi = const capi::PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetPjrtApi>(::dlsym(lib, "GetPjrtApi"));
  if (!get_api)
    throw DeviceError(str_cat("PJRT plugin ", path,
                              " does not export GetPjrtApi: it is not a PJRT C-API plugin"));
  const capi::PJRT_Api* api = get_api();
  if (!api || api->struct_size < sizeof(capi::PJRT_Api))
    throw DeviceError(str_cat("PJRT plugin ", path, ": GetPjrtApi returned no function table"));
  std::unique_ptr<Plugin> plugin(new Plugin(key, api));
  const Plugin& ref = *plugin;
  loaded->emplace(key, std::move(plugin));
  return ref;
}

Plugin::Plugin(std::string path, const capi::PJRT_Api* api)
    : path_(std::move(path)),
      api_(api),
      api_major_(api->pjrt_api_version.major_version),
      api_minor_(api->pjrt_api_version.minor_version) {
  if (api_major_ != capi::kApiMajor || api_minor_ < capi::kOldestApiMinor)
    throw UnsupportedError(str_cat(
        "PJRT plugin ", path_, " speaks PJRT C API ", api_major_, ".", api_minor_,
        "; this build drives ", capi::kApiMajor, ".", capi::kOldestApiMinor, " to ",
        capi::kApiMajor, ".", capi::kApiMinor, " and newer minors: install a matching plugin"));
  auto init = capi::make<capi::PJRT_Plugin_Initialize_Args>();
  call(capi::Fn::Plugin_Initialize, init);

  auto attrs = capi::make<capi::PJRT_Plugin_Attributes_Args>();
  call(capi::Fn::Plugin_Attributes, attrs);
  for (size_t i = 0; i < attrs.num_attributes; ++i) {
    const capi::PJRT_NamedValue& v = attrs.attributes[i];
    const std::string_view name(v.name, v.name_size);
    if (name == "xla_version" && v.type == capi::PJRT_NamedValue_kInt64)
      xla_version_ = v.int64_value;
    std::array<int64_t, 3>* version = name == "stablehlo_current_version"   ? &stablehlo_current_
                                      : name == "stablehlo_minimum_version" ? &stablehlo_minimum_
                                                                            : nullptr;
    if (version && v.type == capi::PJRT_NamedValue_kInt64List && v.value_size == 3)
      for (size_t k = 0; k < 3; ++k) (*version)[k] = v.int64_array_value[k];
  }
}

void* Plugin::function(capi::Fn fn) const {
  const size_t offset = capi::kApiFunctionsOffset + sizeof(void*) * size_t(fn);
  void* f = offset + sizeof(void*) <= api_->struct_size
                ? reinterpret_cast<void* const*>(reinterpret_cast<const char*>(api_) +
                                                 capi::kApiFunctionsOffset)[int(fn)]
                : nullptr;
  if (!f)
    throw UnsupportedError(str_cat("PJRT plugin ", path_, " (C API ", api_major_, ".", api_minor_,
                                   ") does not provide ", capi::fn_name(fn)));
  return f;
}

void Plugin::check(capi::PJRT_Error* error, std::string_view call) const {
  if (!error) return;
  using Message = void (*)(capi::PJRT_Error_Message_Args*);
  auto m = capi::make<capi::PJRT_Error_Message_Args>();
  m.error = error;
  reinterpret_cast<Message>(function(capi::Fn::Error_Message))(&m);
  const std::string message(m.message, m.message_size);

  using GetCode = capi::PJRT_Error* (*)(capi::PJRT_Error_GetCode_Args*);
  auto c = capi::make<capi::PJRT_Error_GetCode_Args>();
  c.error = error;
  capi::PJRT_Error* code_error = reinterpret_cast<GetCode>(function(capi::Fn::Error_GetCode))(&c);
  const int code = code_error ? 2 : c.code;  // UNKNOWN when even the code cannot be read
  destroy_error(code_error);
  destroy_error(error);
  throw_for_code(
      code, str_cat(call, " failed in PJRT plugin ", path_, " (", code_name(code), "): ", message));
}

void Plugin::plugin_threw(capi::Fn fn, const std::exception& e) const {
  throw DeviceError(str_cat(capi::fn_name(fn), " threw an exception in PJRT plugin ", path_, ": ",
                            e.what(), " (check the arguments passed to it, e.g. option types)"));
}

void Plugin::destroy_error(capi::PJRT_Error* error) const {
  if (!error) return;
  using Destroy = void (*)(capi::PJRT_Error_Destroy_Args*);
  auto d = capi::make<capi::PJRT_Error_Destroy_Args>();
  d.error = error;
  reinterpret_cast<Destroy>(function(capi::Fn::Error_Destroy))(&d);
}

void Plugin::await(capi::PJRT_Event* event, capi::Fn produced_by) const {
  if (!event) return;
  auto a = capi::make<capi::PJRT_Event_Await_Args>();
  a.event = event;
  capi::PJRT_Error* error = raw_call(capi::Fn::Event_Await, a);
  auto d = capi::make<capi::PJRT_Event_Destroy_Args>();
  d.event = event;
  release(capi::Fn::Event_Destroy, d);
  check(error, str_cat("the event of ", capi::fn_name(produced_by)));
}

// ---- Client ----

namespace {

// Client::build_identity() of a client just created.
std::string make_build_identity(const Plugin& p, const detail::ClientState& state) {
  auto version = capi::make<capi::PJRT_Client_PlatformVersion_Args>();
  version.client = state.client;
  p.call(capi::Fn::Client_PlatformVersion, version);
  // The file's size and time as well: a plugin upgraded in place may report the same versions.
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(p.path(), ec);
  const auto written = std::filesystem::last_write_time(p.path(), ec).time_since_epoch().count();
  std::string id =
      str_cat("plugin ", p.path(), " ", bytes, " bytes, written ", written, "\nPJRT C API ",
              p.api_major(), ".", p.api_minor(), "\nXLA ", p.xla_version(), "\nStableHLO ");
  for (int64_t v : p.stablehlo_current_version()) id += str_cat(v, ".");
  id += str_cat("\nplatform ", state.platform_name, " ",
                std::string_view(version.platform_version, version.platform_version_size),
                "\ndevices");
  for (const Device& d : state.devices) id += " " + d.kind;
  id += "\ncompile options";
  for (char c : kCompileOptions) id += str_cat(" ", int(static_cast<unsigned char>(c)));
  return id + "\n";
}

}  // namespace

Client::Client(const Plugin& plugin, const std::vector<ClientOption>& options) {
  const std::vector<capi::PJRT_NamedValue> values = named_values(options);
  auto create = capi::make<capi::PJRT_Client_Create_Args>();
  create.create_options = values.data();
  create.num_options = values.size();
  plugin.call(capi::Fn::Client_Create, create);
  auto state = std::make_shared<detail::ClientState>(plugin, create.client);

  auto name = capi::make<capi::PJRT_Client_PlatformName_Args>();
  name.client = state->client;
  plugin.call(capi::Fn::Client_PlatformName, name);
  state->platform_name.assign(name.platform_name, name.platform_name_size);

  auto devices = capi::make<capi::PJRT_Client_AddressableDevices_Args>();
  devices.client = state->client;
  plugin.call(capi::Fn::Client_AddressableDevices, devices);
  for (size_t i = 0; i < devices.num_addressable_devices; ++i) {
    auto desc = capi::make<capi::PJRT_Device_GetDescription_Args>();
    desc.device = devices.addressable_devices[i];
    plugin.call(capi::Fn::Device_GetDescription, desc);
    auto id = capi::make<capi::PJRT_DeviceDescription_Id_Args>();
    id.device_description = desc.device_description;
    plugin.call(capi::Fn::DeviceDescription_Id, id);
    auto kind = capi::make<capi::PJRT_DeviceDescription_Kind_Args>();
    kind.device_description = desc.device_description;
    plugin.call(capi::Fn::DeviceDescription_Kind, kind);
    state->devices.push_back(
        {desc.device, id.id, std::string(kind.device_kind, kind.device_kind_size)});
  }
  if (state->devices.empty())
    throw DeviceError(str_cat("PJRT plugin ", plugin.path(), ": the ", state->platform_name,
                              " client has no addressable devices"));
  state->build_identity = make_build_identity(plugin, *state);
  shared_ = std::move(state);
}

const Plugin& Client::plugin() const { return *shared_->plugin; }
const std::string& Client::platform_name() const { return shared_->platform_name; }
const std::vector<Device>& Client::devices() const { return shared_->devices; }

const std::string& Client::build_identity() const { return shared_->build_identity; }

void detail::host_type_mismatch(size_t host_size, ElementType type) {
  throw InvalidArgumentError(str_cat("host elements of ", host_size, " bytes do not match PJRT ",
                                     element_type_name(type), " (", element_size(type),
                                     " bytes each)"));
}

Buffer Client::buffer_from_host(const void* data, size_t bytes, ElementType type,
                                const std::vector<int64_t>& dims, const Device* device) const {
  const std::string shape = shape_string(type, dims);
  size_t expected = element_size(type);
  for (int64_t d : dims) {
    if (d < 0)
      throw InvalidArgumentError(str_cat("PJRT buffer ", shape, ": dimensions must be >= 0"));
    if (d > 0 && expected > std::numeric_limits<size_t>::max() / size_t(d))
      throw InvalidArgumentError(str_cat("PJRT buffer ", shape, ": the size overflows"));
    expected *= size_t(d);
  }
  if (bytes != expected)
    throw InvalidArgumentError(
        str_cat("PJRT buffer ", shape, " needs ", expected, " bytes of host data, got ", bytes));
  if (!data && bytes > 0)
    throw InvalidArgumentError(str_cat("PJRT buffer ", shape, ": host data is null"));
  const Device& target = device ? *device : shared_->devices.front();
  bool ours = false;
  for (const Device& d : shared_->devices) ours = ours || d.handle == target.handle;
  if (!ours)
    throw InvalidArgumentError(str_cat("PJRT buffer ", shape, ": device ", target.id,
                                       " is not one of this client's devices"));

  auto a = capi::make<capi::PJRT_Client_BufferFromHostBuffer_Args>();
  a.client = shared_->client;
  a.data = data;
  a.type = int(type);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = capi::kImmutableOnlyDuringCall;
  a.device = target.handle;
  plugin().call(capi::Fn::Client_BufferFromHostBuffer, a);
  Buffer buffer(shared_, a.buffer);
  plugin().await(a.done_with_host_buffer, capi::Fn::Client_BufferFromHostBuffer);
  return buffer;
}

LoadedExecutable Client::compile(std::string_view mlir) const {
  const capi::PJRT_Program program = mlir_program(mlir);
  auto a = capi::make<capi::PJRT_Client_Compile_Args>();
  a.client = shared_->client;
  a.program = &program;
  a.compile_options = kCompileOptions;
  a.compile_options_size = sizeof(kCompileOptions);
  plugin().call(capi::Fn::Client_Compile, a);
  LoadedExecutable exe(shared_, a.executable);
  exe.parameters_ = main_parameters(mlir);
  return exe;
}

LoadedExecutable Client::deserialize(std::string_view bytes, std::string_view mlir) const {
  auto a = capi::make<capi::PJRT_Executable_DeserializeAndLoad_Args>();
  a.client = shared_->client;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  plugin().call(capi::Fn::Executable_DeserializeAndLoad, a);
  LoadedExecutable exe(shared_, a.loaded_executable);
  exe.parameters_ = main_parameters(mlir);
  return exe;
}

// ---- Buffer ----

Buffer::Buffer(std::shared_ptr<const detail::ClientState> client, capi::PJRT_Buffer* handle)
    : client_(std::move(client)), handle_(handle) {}

Buffer::Buffer(Buffer&& other) noexcept
    : client_(std::move(other.client_)), handle_(std::exchange(other.handle_, nullptr)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Buffer old(std::move(*this));
    client_ = std::move(other.client_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

Buffer::~Buffer() {
  if (!handle_) return;
  auto a = capi::make<capi::PJRT_Buffer_Destroy_Args>();
  a.buffer = handle_;
  plugin().release(capi::Fn::Buffer_Destroy, a);
}

const Plugin& Buffer::plugin() const { return *client_->plugin; }

capi::PJRT_Buffer* Buffer::handle() const {
  if (!handle_) throw InvalidArgumentError("a moved-from PJRT buffer was used");
  return handle_;
}

ElementType Buffer::element_type() const {
  auto a = capi::make<capi::PJRT_Buffer_ElementType_Args>();
  a.buffer = handle();
  plugin().call(capi::Fn::Buffer_ElementType, a);
  return ElementType(a.type);
}

std::vector<int64_t> Buffer::dims() const {
  auto a = capi::make<capi::PJRT_Buffer_Dimensions_Args>();
  a.buffer = handle();
  plugin().call(capi::Fn::Buffer_Dimensions, a);
  return std::vector<int64_t>(a.dims, a.dims + a.num_dims);
}

bool Buffer::is_deleted() const {
  auto a = capi::make<capi::PJRT_Buffer_IsDeleted_Args>();
  a.buffer = handle();
  plugin().call(capi::Fn::Buffer_IsDeleted, a);
  return a.is_deleted;
}

std::vector<std::byte> Buffer::to_host() const {
  if (is_deleted())
    throw InvalidArgumentError(
        "a donated PJRT buffer was read: its storage now belongs to the execution's output");
  auto size = capi::make<capi::PJRT_Buffer_ToHostBuffer_Args>();
  size.src = handle_;  // dst null: the plugin only reports the size
  plugin().call(capi::Fn::Buffer_ToHostBuffer, size);
  std::vector<std::byte> out(size.dst_size);
  auto copy = capi::make<capi::PJRT_Buffer_ToHostBuffer_Args>();
  copy.src = handle_;
  copy.dst = out.data();
  copy.dst_size = out.size();
  plugin().call(capi::Fn::Buffer_ToHostBuffer, copy);
  plugin().await(copy.event, capi::Fn::Buffer_ToHostBuffer);
  return out;
}

void Buffer::check_host_type(size_t host_element_size) const {
  const ElementType type = element_type();
  if (host_element_size != element_size(type)) detail::host_type_mismatch(host_element_size, type);
}

// ---- LoadedExecutable ----

namespace {

// Calls `use` with the PJRT_Executable behind `loaded` and releases that handle before throwing
// the error `use` returns (from `fn`), if any.
template <typename Use>
void with_executable(const Plugin& plugin, capi::PJRT_LoadedExecutable* loaded, capi::Fn fn,
                     Use use) {
  auto get = capi::make<capi::PJRT_LoadedExecutable_GetExecutable_Args>();
  get.loaded_executable = loaded;
  plugin.call(capi::Fn::LoadedExecutable_GetExecutable, get);
  capi::PJRT_Error* error = use(get.executable);
  auto d = capi::make<capi::PJRT_Executable_Destroy_Args>();
  d.executable = get.executable;
  plugin.release(capi::Fn::Executable_Destroy, d);
  plugin.check(error, capi::fn_name(fn));
}

}  // namespace

LoadedExecutable::LoadedExecutable(std::shared_ptr<const detail::ClientState> client,
                                   capi::PJRT_LoadedExecutable* handle)
    : client_(std::move(client)), handle_(handle) {
  const Plugin& plugin = *client_->plugin;
  auto n = capi::make<capi::PJRT_Executable_NumOutputs_Args>();
  with_executable(plugin, handle_, capi::Fn::Executable_NumOutputs, [&](capi::PJRT_Executable* e) {
    n.executable = e;
    return plugin.raw_call(capi::Fn::Executable_NumOutputs, n);
  });
  num_outputs_ = n.num_outputs;
}

std::string LoadedExecutable::serialize() const {
  if (!handle_) throw InvalidArgumentError("a moved-from PJRT executable was serialized");
  const Plugin& plugin = *client_->plugin;
  std::string bytes;
  with_executable(plugin, handle_, capi::Fn::Executable_Serialize, [&](capi::PJRT_Executable* e) {
    auto a = capi::make<capi::PJRT_Executable_Serialize_Args>();
    a.executable = e;
    capi::PJRT_Error* error = plugin.raw_call(capi::Fn::Executable_Serialize, a);
    if (!error) {
      bytes.assign(a.serialized_bytes, a.serialized_bytes_size);
      if (a.serialized_executable_deleter) a.serialized_executable_deleter(a.serialized_executable);
    }
    return error;
  });
  return bytes;
}

LoadedExecutable::LoadedExecutable(LoadedExecutable&& other) noexcept
    : client_(std::move(other.client_)),
      handle_(std::exchange(other.handle_, nullptr)),
      num_outputs_(other.num_outputs_),
      parameters_(std::move(other.parameters_)) {}

LoadedExecutable& LoadedExecutable::operator=(LoadedExecutable&& other) noexcept {
  if (this != &other) {
    LoadedExecutable old(std::move(*this));
    client_ = std::move(other.client_);
    handle_ = std::exchange(other.handle_, nullptr);
    num_outputs_ = other.num_outputs_;
    parameters_ = std::move(other.parameters_);
  }
  return *this;
}

LoadedExecutable::~LoadedExecutable() {
  if (!handle_) return;
  auto a = capi::make<capi::PJRT_LoadedExecutable_Destroy_Args>();
  a.executable = handle_;
  client_->plugin->release(capi::Fn::LoadedExecutable_Destroy, a);
}

std::vector<Buffer> LoadedExecutable::execute(const std::vector<const Buffer*>& args) const {
  if (!handle_) throw InvalidArgumentError("a moved-from PJRT executable was run");
  if (parameters_ && args.size() != parameters_->size())
    throw InvalidArgumentError(str_cat("PJRT execute: @main takes ", parameters_->size(),
                                       " arguments, got ", args.size()));
  const Plugin& plugin = *client_->plugin;
  std::vector<capi::PJRT_Buffer*> arg_handles;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i] || !args[i]->handle_)
      throw InvalidArgumentError(str_cat("PJRT execute: argument ", i, " is null or moved-from"));
    if (args[i]->client_ != client_)
      throw InvalidArgumentError(
          str_cat("PJRT execute: argument ", i, " belongs to another client"));
    if (args[i]->is_deleted())
      throw InvalidArgumentError(
          str_cat("PJRT execute: argument ", i,
                  " was donated to an earlier execution; pass the output that replaced it"));
    if (parameters_) {
      const ParameterType& want = (*parameters_)[i];
      const ElementType type = args[i]->element_type();
      const std::vector<int64_t> dims = args[i]->dims();
      if (type != want.type || dims != want.dims)
        throw InvalidArgumentError(str_cat("PJRT execute: argument ", i, " is ",
                                           shape_string(type, dims), " but @main's parameter ", i,
                                           " is ", shape_string(want.type, want.dims)));
    }
    arg_handles.push_back(args[i]->handle_);
  }
  std::vector<capi::PJRT_Buffer*> outputs(num_outputs_, nullptr);
  capi::PJRT_Buffer* const* arg_list = arg_handles.data();
  capi::PJRT_Buffer** output_list = outputs.data();
  capi::PJRT_Event* done = nullptr;

  auto options = capi::make<capi::PJRT_ExecuteOptions>();
  auto a = capi::make<capi::PJRT_LoadedExecutable_Execute_Args>();
  a.executable = handle_;
  a.options = &options;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = arg_handles.size();
  a.output_lists = &output_list;
  a.device_complete_events = &done;
  plugin.call(capi::Fn::LoadedExecutable_Execute, a);
  std::vector<Buffer> results;
  for (capi::PJRT_Buffer* b : outputs) results.push_back(Buffer(client_, b));
  plugin.await(done, capi::Fn::LoadedExecutable_Execute);
  return results;
}

// ---- Topology ----

namespace {

// The TPU generations libtpu knows, with one chip's HBM in GiB (chip_hbm_bytes).
constexpr std::pair<std::string_view, int64_t> kGenerations[] = {
    {"v2", 16}, {"v3", 32}, {"v4", 32}, {"v5e", 16}, {"v5p", 95}, {"v6e", 32}, {"tpu7x", 192}};

}  // namespace

void check_topology_name(const std::string& name) {
  const size_t colon = name.find(':');
  const std::string_view generation = std::string_view(name).substr(0, colon);
  auto refuse = [&](const std::string& why) {
    throw InvalidArgumentError(str_cat("topology \"", name, "\": ", why,
                                       "; give GENERATION:CHIPS, e.g. v5e:2x2 or v4:2x2x1"));
  };
  if (colon == std::string::npos) refuse("no ':' between the TPU generation and the chips");
  if (std::ranges::find(kGenerations, generation, &std::pair<std::string_view, int64_t>::first) ==
      std::end(kGenerations))
    refuse(str_cat("'", generation,
                   "' is not a TPU generation: use v2, v3, v4, v5e, v5p, v6e or tpu7x"));
  std::string_view rest = std::string_view(name).substr(colon + 1);
  int dims = 0;
  for (;;) {
    const size_t x = rest.find('x');
    const std::string_view part = rest.substr(0, x);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size())
      refuse(str_cat("'", part, "' is not a number of chips"));
    if (v < 1 || v > 4096) refuse(str_cat("dimension ", v, " must be from 1 to 4096"));
    ++dims;
    if (x == std::string_view::npos) break;
    rest.remove_prefix(x + 1);
  }
  if (dims != 2 && dims != 3) refuse(str_cat(dims, " dimensions; a slice has 2 or 3"));
}

int64_t chip_hbm_bytes(const std::string& topology) {
  check_topology_name(topology);
  const std::string_view generation = std::string_view(topology).substr(0, topology.find(':'));
  for (const auto& [name, gib] : kGenerations)
    if (name == generation) return gib << 30;
  throw InternalError("chip_hbm_bytes: no HBM size for " + std::string(generation));
}

Topology::Topology(const Plugin& plugin, const std::string& name,
                   const std::vector<ClientOption>& options)
    : plugin_(&plugin), name_(name) {
  check_topology_name(name);
  const std::vector<capi::PJRT_NamedValue> values = named_values(options);
  auto a = capi::make<capi::PJRT_TopologyDescription_Create_Args>();
  a.topology_name = name.data();
  a.topology_name_size = name.size();
  a.create_options = values.data();
  a.num_options = values.size();
  plugin.check(
      plugin.raw_call(capi::Fn::TopologyDescription_Create, a),
      str_cat(capi::fn_name(capi::Fn::TopologyDescription_Create), " for topology \"", name, "\""));
  handle_ = a.topology;
  auto p = capi::make<capi::PJRT_TopologyDescription_PlatformName_Args>();
  p.topology = handle_;
  if (capi::PJRT_Error* error = plugin.raw_call(capi::Fn::TopologyDescription_PlatformName, p)) {
    destroy();  // the destructor does not run for an object whose constructor threw
    plugin.check(error, capi::fn_name(capi::Fn::TopologyDescription_PlatformName));
  }
  platform_name_.assign(p.platform_name, p.platform_name_size);
}

Topology::Topology(Topology&& other) noexcept
    : plugin_(other.plugin_),
      handle_(std::exchange(other.handle_, nullptr)),
      name_(std::move(other.name_)),
      platform_name_(std::move(other.platform_name_)) {}

Topology::~Topology() { destroy(); }

void Topology::destroy() noexcept {
  if (!handle_) return;
  auto a = capi::make<capi::PJRT_TopologyDescription_Destroy_Args>();
  a.topology = std::exchange(handle_, nullptr);
  plugin_->release(capi::Fn::TopologyDescription_Destroy, a);
}

CompiledProgram Topology::compile(std::string_view mlir) const {
  const capi::PJRT_Program program = mlir_program(mlir);
  auto a = capi::make<capi::PJRT_Compile_Args>();
  a.topology = handle_;
  a.program = &program;
  a.compile_options = kCompileOptions;
  a.compile_options_size = sizeof(kCompileOptions);
  plugin_->call(capi::Fn::Compile, a);
  // The executable is only inspected: it lives until the end of this call.
  struct Owner {
    const Plugin& plugin;
    capi::PJRT_Executable* executable;
    ~Owner() {
      auto d = capi::make<capi::PJRT_Executable_Destroy_Args>();
      d.executable = executable;
      plugin.release(capi::Fn::Executable_Destroy, d);
    }
  } owner{*plugin_, a.executable};

  CompiledProgram out;
  auto m = capi::make<capi::PJRT_Executable_GetCompiledMemoryStats_Args>();
  m.executable = a.executable;
  plugin_->call(capi::Fn::Executable_GetCompiledMemoryStats, m);
  out.memory = {m.generated_code_size_in_bytes, m.argument_size_in_bytes, m.output_size_in_bytes,
                m.alias_size_in_bytes,          m.temp_size_in_bytes,     m.peak_memory_in_bytes};

  auto c = capi::make<capi::PJRT_Executable_GetCostAnalysis_Args>();
  c.executable = a.executable;
  // Cost analysis is optional in the API: a plugin without it still compiled the program.
  if (capi::PJRT_Error* error = plugin_->raw_call(capi::Fn::Executable_GetCostAnalysis, c)) {
    try {
      plugin_->check(error, capi::fn_name(capi::Fn::Executable_GetCostAnalysis));
    } catch (const UnsupportedError&) {
      return out;
    }
  }
  for (size_t i = 0; i < c.num_properties; ++i) {
    const capi::PJRT_NamedValue& v = c.properties[i];
    double value;
    if (v.type == capi::PJRT_NamedValue_kFloat)
      value = v.float_value;
    else if (v.type == capi::PJRT_NamedValue_kInt64)
      value = double(v.int64_value);
    else
      continue;
    out.cost.emplace_back(std::string(v.name, v.name_size), value);
  }
  return out;
}

}  // namespace tformers::backends::pjrt
