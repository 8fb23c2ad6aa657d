// Hub kernels: packages of optimized layer implementations, loaded at run time, pinned by a lock
// file and swapped into a model's compiled graph, as Hugging Face's `kernels` library does for
// Transformers.
//
//   auto lm = tformers::AutoModelForCausalLM::from_pretrained("Qwen/Qwen3-0.6B");
//   tformers::kernelize(lm, {{"RMSNorm", {{"cpu", {"tformers-community/fused-norms", 1}}}},
//                            {"SiLUAndMul", {{"cpu", {"tformers-community/fused-norms", 1}}}}});
//
// A package for repo id "org/name" and major version N is a folder holding manifest.json (name,
// version, license, backends, and the layers it implements with their argument schema) and
// build/<variant>/ with one shared library per variant. Variant names encode the C ABI version,
// the backend, the CPU architecture, its features and the OS:
//   cabi1-cpu-x86_64-avx512bf16-linux, cabi1-cpu-x86_64-avx2-linux, cabi1-cpu-x86_64-linux.
// The library's C interface is include/tformers/kernel_abi.h.
//
// Packages are found in a kernel cache laid out like the Hugging Face hub cache:
//   <root>/kernels--org--name/refs/v1          (a file holding the revision)
//   <root>/kernels--org--name/snapshots/<revision>/manifest.json, build/<variant>/lib*.so
// with roots from KernelOptions::cache_dirs, else $TFORMERS_KERNELS_PATH (':'-separated), else
// $XDG_CACHE_HOME/tformers/kernels or ~/.cache/tformers/kernels. For development, one repo can
// be pointed at a package folder instead: KernelOptions::local_overrides or
// $TFORMERS_LOCAL_KERNELS="org/name=/path/to/package:org/other=/path" (revision "local").
//
// Trust: kernels.lock pins each package's revision and the sha256 of its manifest and of every
// file of every variant. Every load hashes the bytes it is about to map and refuses a mismatch;
// a package the lock does not pin is refused unless allow_unpinned (or
// TFORMERS_KERNELS_ALLOW_UNPINNED=1) says otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tformers {

class CausalLM;
namespace kernels_hub {
struct KernelAccess;
}

struct KernelOptions {
  // Cache roots searched in order; empty: the environment (see above).
  std::vector<std::string> cache_dirs;
  // Repo id -> package folder (manifest.json, build/); merged over $TFORMERS_LOCAL_KERNELS.
  std::map<std::string, std::string> local_overrides;
  // The lock file; empty: $TFORMERS_KERNELS_LOCK, else ./kernels.lock when it exists.
  std::string lock_file;
  // Load packages that the lock does not pin (pinned ones are verified either way).
  bool allow_unpinned = false;
  // The backend the kernels will run on.
  std::string device = "cpu";
};

// What a variant must fit. current() describes this process: its OS, CPU architecture and the
// CPU target the built-in kernels use (TFORMERS_CPU_TARGET can lower it).
struct KernelPlatform {
  std::string os;                     // "linux"
  std::string arch;                   // "x86_64"
  std::string cpu_target;             // "scalar", "avx2", "avx512" or "avx512bf16"
  std::vector<std::string> backends;  // {"cpu"}
  static KernelPlatform current();
};

// One build variant of a package and whether it can run here.
struct VariantCheck {
  std::string name;
  bool compatible = false;
  std::string reason;  // why it was rejected; for a compatible one, what it needs
};

// Every folder under <package>/build/, the compatible ones first, best first (most capable CPU
// features), then the rejected ones with their reasons. `backends` limits the backends accepted
// (the manifest's list); empty accepts any the platform has.
std::vector<VariantCheck> check_variants(const std::string& package_dir,
                                         const KernelPlatform& platform,
                                         const std::vector<std::string>& backends = {});

// A loaded package variant. Copies share the loaded library, which stays mapped while any copy
// or any compiled graph that calls into it is alive.
class Kernel {
 public:
  const std::string& repo_id() const;
  int version() const;                         // the major version asked for (refs/v<N>)
  const std::string& package_version() const;  // manifest "version", e.g. "1.0.0"
  const std::string& revision() const;         // "local" for a local override
  const std::string& variant() const;
  const std::string& path() const;  // the package folder
  const std::string& license() const;
  bool pinned() const;  // verified against the lock file
  std::vector<std::string> layers() const;
  bool has_layer(const std::string& layer) const;
  // The layer's argument schema, "x:f32,weight:f32|bf16;eps:f32->y:f32".
  const std::string& schema(const std::string& layer) const;
  // "org/name@v1 (1.0.0, revision abc, variant cabi1-cpu-x86_64-avx2-linux)".
  std::string describe() const;

  struct Impl;

 private:
  friend struct kernels_hub::KernelAccess;
  explicit Kernel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// Resolves, verifies and loads the best variant of `repo_id` at major `version`. Errors:
// NotFoundError (no such package or version; lists where it looked), UnsupportedError (no
// variant fits: lists every variant with its reason), FormatError (bad manifest, bad library,
// digest mismatch, wrong ABI), InvalidArgumentError (bad repo id, unpinned without opt-in).
Kernel get_kernel(const std::string& repo_id, int version, const KernelOptions& options = {});

// The package folder get_kernel would use (a snapshot or a local override), and its revision.
struct ResolvedPackage {
  std::string path;
  std::string revision;
};
ResolvedPackage resolve_kernel_package(const std::string& repo_id, int version,
                                       const KernelOptions& options = {});

// ---- Lock files ------------------------------------------------------------------------------

struct LockEntry {
  std::string repo_id;
  int version = 1;
  std::string revision;
  std::string manifest_sha256;
  // variant -> (path relative to the package folder -> sha256 hex)
  std::map<std::string, std::map<std::string, std::string>> variants;
};

struct LockFile {
  std::vector<LockEntry> kernels;

  // FormatError naming the file and JSON path; NotFoundError when missing.
  static LockFile load(const std::string& path);
  void save(const std::string& path) const;
  const LockEntry* find(const std::string& repo_id, int version) const;
  // Replaces the entry for the same repo and version, or appends.
  void upsert(LockEntry entry);
};

// Pins a package as the cache resolves it now: revision, manifest and every variant's files.
LockEntry lock_kernel(const std::string& repo_id, int version, const KernelOptions& options = {});
// Checks every entry against the cache; one line per problem, empty when everything matches.
std::vector<std::string> verify_lock(const LockFile& lock, const KernelOptions& options = {});

// Lower-case hex SHA-256 (FIPS 180-4) of bytes or of a file's contents.
std::string sha256_hex(const void* data, size_t size);
std::string sha256_file(const std::string& path);

// ---- kernelize -------------------------------------------------------------------------------

// Where one layer's kernel comes from: a package and the layer inside it (default: the same
// name as the model layer it replaces).
struct LayerRepository {
  std::string repo_id;
  int version = 1;
  std::string layer_name;
};

// Model layer ("RMSNorm", "SiLUAndMul", "RotaryEmbedding", "Attention") -> device -> kernel.
using KernelMapping = std::map<std::string, std::map<std::string, LayerRepository>>;

struct KernelizeOptions {
  // Where no kernel fits (device, mode, dtypes or CPU), use the built-in op. When false, that
  // is an UnsupportedError (at kernelize for device and CPU, at the first forward of a shape
  // for mode and dtypes).
  bool use_fallback = true;
  KernelOptions kernel_options;
};

// What kernelize decided for one mapped layer.
struct KernelizedLayer {
  std::string layer;
  std::string kernel;  // Kernel::describe(), empty when the built-in op is used
  std::string note;    // why the built-in op is used, or the modes and dtypes the kernel takes
};

// Replaces the mapped layers of the model with hub kernels: each becomes a custom-call node in
// the graphs compiled from now on (steps compiled before are dropped). Calling it again
// replaces the mapping; an empty mapping restores the built-in ops. With USE_HUB_KERNELS=0 in
// the environment it does nothing but say so.
std::vector<KernelizedLayer> kernelize(CausalLM& model, const KernelMapping& mapping,
                                       const KernelizeOptions& options = {});

// What use_kernels (Python's from_pretrained, --use-kernels on the command line) maps when given
// no mapping, as Transformers' use_kernels applies the kernels library's defaults: the layers of
// the package built with tformers, tformers-community/fused-norms v1 (RMSNorm and SiLUAndMul on
// the CPU; kernels/README.md). It loads from the kernel cache, or from TFORMERS_LOCAL_KERNELS.
KernelMapping default_kernel_mapping();

// The layer names kernelize understands and their argument schemas (the contracts a package's
// manifest must follow).
std::map<std::string, std::string> kernel_layer_contracts();

}  // namespace tformers
