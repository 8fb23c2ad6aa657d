// Internals of kernel packages: argument schemas and the layer contracts they must follow,
// manifests, variant names, and the loaded library behind a tformers::Kernel.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tformers/kernel_abi.h"
#include "tformers/kernels.h"

namespace tformers::kernels_hub {

// One argument of a schema: "weight:f32|bf16".
struct SchemaArg {
  std::string name;
  std::vector<std::string> dtypes;  // "f32", "bf16", "f16", "i32", "i64"
  bool operator==(const SchemaArg&) const = default;
};

// inputs ';' attributes '->' output, as in kernel_abi.h.
struct Schema {
  std::vector<SchemaArg> inputs, attributes;
  SchemaArg output;
  std::string str() const;  // canonical form
};

// Parses "name:dtype|dtype,...;...->name:dtype"; FormatError naming `where` when malformed.
Schema parse_schema(const std::string& text, const std::string& where);
SchemaArg parse_schema_arg(const std::string& text, const std::string& where);

// The contract tformers gives each replaceable layer: argument names in order and the dtypes it
// may pass. A package's schema names the same arguments in the same order, with a subset of
// the dtypes.
const std::map<std::string, Schema>& layer_contracts();
// Empty when `s` fits the contract of `layer`, else what does not match.
std::string check_against_contract(const std::string& layer, const Schema& s);

struct ManifestLayer {
  Schema schema;
  uint32_t modes = TF_KERNEL_MODE_PREFILL | TF_KERNEL_MODE_DECODE;
};

struct Manifest {
  std::string name, version, license;
  int major = 0;
  std::vector<std::string> backends;
  std::map<std::string, ManifestLayer> layers;
};

// `bytes` are the manifest file's contents (already hashed by the caller); `where` its path.
Manifest parse_manifest(const std::string& bytes, const std::string& where);

// "cabi1-cpu-x86_64-avx2-linux" split into its parts.
struct VariantName {
  int abi = 0;
  std::string backend, arch, feature, os;  // feature is empty for a baseline build
};
// False (with the reason) when the name does not follow the grammar.
bool parse_variant_name(const std::string& name, VariantName& out, std::string& why);
// The rank of a CPU feature token: 0 for none, higher is more capable; -1 when unknown.
int feature_rank(const std::string& feature);

std::string modes_str(uint32_t modes);  // "prefill, decode"

}  // namespace tformers::kernels_hub

namespace tformers {

// A loaded variant. The library stays mapped until the last Kernel copy and the last graph
// node that refers to it are gone. Loading registers each of its kernels under target(layer)
// for its backend (backends/kernel_registry.h), where backends find them when they compile.
struct Kernel::Impl {
  struct Entry {
    std::string layer;
    kernels_hub::Schema schema;
    std::string schema_text;
    uint32_t modes = 0;
    TfKernelFn fn = nullptr;
  };
  std::string repo_id, package_version, revision, variant, path, license, library_sha256;
  std::string backend;
  int version = 0;
  bool pinned = false;
  std::map<std::string, Entry> entries;
  void* handle = nullptr;  // dlopen handle
  int fd = -1;             // the memory file it was loaded from
  // The name graphs call `layer` of this variant by (graph::CustomCall::target): package,
  // version, revision, variant, layer and the library's digest, so that graphs calling
  // different builds never share an executable.
  std::string target(const std::string& layer) const;
  ~Impl();
};

namespace kernels_hub {

// The way into a Kernel handle for kernels_hub/ and its tests; nothing in include/ reaches it.
struct KernelAccess {
  static const std::shared_ptr<Kernel::Impl>& impl(const Kernel& kernel) { return kernel.impl_; }
  static Kernel wrap(std::shared_ptr<Kernel::Impl> impl) { return Kernel(std::move(impl)); }
};

}  // namespace kernels_hub

}  // namespace tformers
