// Finding, verifying and loading kernel packages; lock files.
//
// A library is loaded from the very bytes that were hashed: they are read once, checked against
// the lock, copied into an anonymous memory file (memfd) and dlopen'ed from there, so a file
// swapped on disk between the check and the load is never what runs.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backends/kernel_registry.h"
#include "core/paths.h"
#include "io/file.h"
#include "io/json.h"
#include "io/shared_library.h"
#include "kernels_hub/package.h"
#include "kernels_hub/sha256.h"
#include "tformers/error.h"

namespace tformers {

namespace fs = std::filesystem;
using namespace kernels_hub;

namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

bool safe_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'))
      return false;
  return true;
}

void check_repo_id(const std::string& repo_id) {
  size_t slash = repo_id.find('/');
  if (slash == std::string::npos || !safe_name(repo_id.substr(0, slash)) ||
      !safe_name(repo_id.substr(slash + 1)))
    throw InvalidArgumentError("kernel repo id '" + repo_id +
                               "' must be org/name with letters, digits, '.', '-' and '_', e.g. "
                               "\"tformers-community/fused-norms\"");
}

void check_version(const std::string& repo_id, int version) {
  if (version < 1)
    throw InvalidArgumentError("kernel " + repo_id +
                               ": version must be a major version >= 1, got " +
                               std::to_string(version));
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::vector<std::string> cache_roots(const KernelOptions& o) {
  if (!o.cache_dirs.empty()) return o.cache_dirs;
  std::vector<std::string> roots;
  if (std::string p = env("TFORMERS_KERNELS_PATH"); !p.empty()) {
    size_t begin = 0;
    while (begin <= p.size()) {
      size_t end = p.find(':', begin);
      if (end == std::string::npos) end = p.size();
      if (end > begin) roots.push_back(p.substr(begin, end - begin));
      begin = end + 1;
    }
    return roots;
  }
  if (std::string dir = user_cache_dir("kernels"); !dir.empty()) roots.push_back(dir);
  return roots;
}

std::map<std::string, std::string> local_overrides(const KernelOptions& o) {
  std::map<std::string, std::string> out;
  std::string spec = env("TFORMERS_LOCAL_KERNELS");
  size_t begin = 0;
  while (begin < spec.size()) {
    size_t end = spec.find(':', begin);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos)
      throw InvalidArgumentError("TFORMERS_LOCAL_KERNELS: '" + item +
                                 "' must be org/name=/path/to/package");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  for (const auto& [k, v] : o.local_overrides) out[k] = v;
  return out;
}

std::string lock_path(const KernelOptions& o) {
  if (!o.lock_file.empty()) return o.lock_file;
  if (std::string p = env("TFORMERS_KERNELS_LOCK"); !p.empty()) return p;
  std::error_code ec;
  if (fs::exists("kernels.lock", ec)) return "kernels.lock";
  return "";
}

bool allow_unpinned(const KernelOptions& o) {
  std::string e = env("TFORMERS_KERNELS_ALLOW_UNPINNED");
  return o.allow_unpinned || e == "1" || e == "true" || e == "yes";
}

std::string read_text(const std::string& path) {
  std::vector<char> bytes = read_file_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

// Regular files under `dir`, as paths relative to `base` with '/' separators, sorted. The paths
// are taken as listed, not resolved: in a hub-style cache every file is a symlink into blobs/,
// and resolving would name the blob instead of the file. Each must still resolve inside `base`
// (or the cache's blobs), so a link to /etc/passwd is refused rather than hashed or loaded.
std::vector<std::string> files_under(const fs::path& dir, const fs::path& base) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    std::string rel = it->path().lexically_relative(base).generic_string();
    io::resolve_inside(base.string(), rel, "kernel package " + base.string());
    out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::map<std::string, std::string> hash_variant(const fs::path& pkg, const std::string& variant) {
  std::map<std::string, std::string> out;
  for (const auto& rel : files_under(pkg / "build" / variant, pkg))
    out[rel] = sha256_file((pkg / rel).string());
  return out;
}

// The lock file in force; a named file that does not exist yet pins nothing.
LockFile load_lock(const KernelOptions& o, std::string& path) {
  path = lock_path(o);
  std::error_code ec;
  if (path.empty() || !fs::exists(path, ec)) return {};
  return LockFile::load(path);
}

// dlopen of bytes already in memory, through an anonymous file. The file stays open while the
// library is loaded: the dynamic loader recognizes a loaded library by its path, and
// "/proc/self/fd/<fd>" is only unique while the descriptor is held.
void* load_library_bytes(const std::vector<char>& bytes, const std::string& name,
                         const std::string& where, int& fd_out) {
  io::check_shared_library(bytes, where);  // a truncated library would fault inside dlopen
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    // No memfd (old kernel, seccomp): an unlinked temporary file serves the same purpose.
    std::string tmpl = (fs::temp_directory_path() / "tformers-kernel-XXXXXX").string();
    fd = mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(tmpl.c_str());
  }
  if (fd < 0) throw Error("cannot create a memory or temporary file to load " + where);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      ::close(fd);
      throw Error("cannot write " + where + " into a memory file");
    }
    done += size_t(n);
  }
  std::string proc = "/proc/self/fd/" + std::to_string(fd);
  dlerror();
  void* handle = dlopen(proc.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    ::close(fd);
    const char* why = dlerror();
    throw FormatError(where + " is not a loadable shared library: " +
                      (why ? std::string(why) : std::string("dlopen failed")));
  }
  fd_out = fd;
  return handle;
}

// Checks the library's table against the manifest; fills impl.entries.
void bind_table(Kernel::Impl& impl, const Manifest& m, const std::string& where) {
  dlerror();
  void* sym = dlsym(impl.handle, TF_KERNEL_ENTRY_POINT);
  if (!sym)
    throw FormatError(
        where +
        " does not export the entry point '" TF_KERNEL_ENTRY_POINT
        "': a kernel library must define extern \"C\" const TfKernelTable* " TF_KERNEL_ENTRY_POINT
        "(void) (include/tformers/kernel_abi.h)");
  auto entry = reinterpret_cast<TfKernelTableFn>(sym);
  const TfKernelTable* t = entry();
  if (!t) throw FormatError(where + ": " TF_KERNEL_ENTRY_POINT "() returned no table");
  if (t->abi_version != TF_KERNEL_ABI_VERSION)
    throw FormatError(where + " was built against kernel C ABI version " +
                      std::to_string(t->abi_version) + " but this tformers speaks version " +
                      std::to_string(TF_KERNEL_ABI_VERSION) +
                      "; rebuild the package against this tformers' kernel_abi.h (its variant "
                      "folder must then be named cabi" +
                      std::to_string(TF_KERNEL_ABI_VERSION) + "-...)");
  if (t->struct_size < sizeof(TfKernelTable))
    throw FormatError(where + ": kernel table is " + std::to_string(t->struct_size) +
                      " bytes, expected " + std::to_string(sizeof(TfKernelTable)));
  if (!t->name || m.name != t->name || !t->version || m.version != t->version)
    throw FormatError(where + " says it is package '" + (t->name ? t->name : "(null)") + "' " +
                      (t->version ? t->version : "(null)") + " but the manifest says '" + m.name +
                      "' " + m.version + "; the library and manifest.json are out of step");
  if (t->num_kernels > 1024 || (t->num_kernels && !t->kernels))
    throw FormatError(where + ": kernel table has an invalid kernel list");
  for (uint32_t i = 0; i < t->num_kernels; ++i) {
    const TfKernelEntry& e = t->kernels[i];
    if (!e.layer || !e.schema || !e.fn)
      throw FormatError(where + ": kernel entry " + std::to_string(i) +
                        " lacks a layer name, schema or function");
    auto ml = m.layers.find(e.layer);
    if (ml == m.layers.end())
      throw FormatError(where + " implements layer '" + e.layer +
                        "', which the manifest does not declare");
    Kernel::Impl::Entry entry_info;
    entry_info.layer = e.layer;
    entry_info.schema_text = e.schema;
    try {
      entry_info.schema = parse_schema(e.schema, where + " layer " + e.layer);
    } catch (const FormatError& err) {
      throw FormatError(std::string(err.what()));
    }
    if (entry_info.schema.str() != ml->second.schema.str())
      throw FormatError(where + ": layer " + e.layer + " has schema \"" + e.schema +
                        "\" but the manifest declares \"" + ml->second.schema.str() +
                        "\"; the library and manifest.json are out of step");
    if (e.modes != ml->second.modes)
      throw FormatError(where + ": layer " + e.layer + " supports modes (" + modes_str(e.modes) +
                        ") but the manifest declares (" + modes_str(ml->second.modes) + ")");
    entry_info.modes = e.modes;
    entry_info.fn = e.fn;
    impl.entries[e.layer] = std::move(entry_info);
  }
  for (const auto& [layer, ml] : m.layers)
    if (!impl.entries.count(layer))
      throw FormatError(where + " does not implement layer " + layer +
                        ", which the manifest declares");
}

}  // namespace

std::string Kernel::Impl::target(const std::string& layer) const {
  return repo_id + "@v" + std::to_string(version) + "/" + revision + "/" + variant + ":" + layer +
         "#" + library_sha256.substr(0, 16);
}

Kernel::Impl::~Impl() {
  if (handle) {
    dlclose(handle);
    // A library the loader keeps resident (e.g. one with unique C++ symbols) keeps its name;
    // its descriptor must then stay open so that no later load reuses that name.
    const std::string name = "/proc/self/fd/" + std::to_string(fd);
    if (void* resident = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      dlclose(resident);
      return;
    }
  }
  if (fd >= 0) ::close(fd);
}

ResolvedPackage resolve_kernel_package(const std::string& repo_id, int version,
                                       const KernelOptions& o) {
  check_repo_id(repo_id);
  check_version(repo_id, version);
  auto overrides = local_overrides(o);
  if (auto it = overrides.find(repo_id); it != overrides.end()) {
    std::error_code ec;
    if (!fs::is_directory(it->second, ec))
      throw NotFoundError("local override for kernel " + repo_id + " points at " + it->second +
                          ", which is not a folder (TFORMERS_LOCAL_KERNELS or "
                          "KernelOptions::local_overrides)");
    return {it->second, "local"};
  }
  const std::string folder = "kernels--" + repo_id.substr(0, repo_id.find('/')) + "--" +
                             repo_id.substr(repo_id.find('/') + 1);
  const std::string ref = "v" + std::to_string(version);
  std::vector<std::string> looked;
  for (const std::string& root : cache_roots(o)) {
    fs::path repo = fs::path(root) / folder;
    std::error_code ec;
    if (!fs::is_directory(repo, ec)) {
      looked.push_back(repo.string() + " (absent)");
      continue;
    }
    fs::path ref_file = repo / "refs" / ref;
    if (!fs::is_regular_file(ref_file, ec)) {
      std::vector<std::string> refs;
      for (const auto& e : fs::directory_iterator(repo / "refs", ec))
        refs.push_back(e.path().filename().string());
      std::sort(refs.begin(), refs.end());
      looked.push_back(ref_file.string() +
                       " (absent; refs there: " + (refs.empty() ? "none" : join(refs, ", ")) + ")");
      continue;
    }
    std::string revision = read_text(ref_file.string());
    while (!revision.empty() && std::isspace(static_cast<unsigned char>(revision.back())))
      revision.pop_back();
    if (!safe_name(revision))
      throw FormatError(ref_file.string() + ": '" + revision + "' is not a revision");
    fs::path snap = repo / "snapshots" / revision;
    if (!fs::is_directory(snap, ec))
      throw NotFoundError(ref_file.string() + " names revision " + revision + " but " +
                          snap.string() + " is missing; fetch the package again");
    return {snap.string(), revision};
  }
  throw NotFoundError(
      "kernel " + repo_id + " version " + std::to_string(version) +
      " is not in the kernel cache; looked in: " +
      (looked.empty() ? "no cache roots (set TFORMERS_KERNELS_PATH)" : join(looked, "; ")) +
      ". Set TFORMERS_KERNELS_PATH, or point TFORMERS_LOCAL_KERNELS=" + repo_id +
      "=/path at a package folder");
}

Kernel get_kernel(const std::string& repo_id, int version, const KernelOptions& o) {
  ResolvedPackage pkg = resolve_kernel_package(repo_id, version, o);
  const fs::path dir = pkg.path;
  const std::string manifest_path = (dir / "manifest.json").string();
  const std::string manifest_bytes = read_text(manifest_path);
  const std::string manifest_sha = sha256_hex(manifest_bytes.data(), manifest_bytes.size());
  Manifest m = parse_manifest(manifest_bytes, manifest_path);
  if (m.major != version)
    throw FormatError(manifest_path + ": version " + m.version + " is not major version " +
                      std::to_string(version) + ", which refs/v" + std::to_string(version) +
                      " should point at");

  std::string lock_file;
  LockFile lock = load_lock(o, lock_file);
  const LockEntry* pin = lock.find(repo_id, version);
  const std::string id = repo_id + "@v" + std::to_string(version);
  if (!pin && !allow_unpinned(o))
    throw InvalidArgumentError(
        "kernel " + id + " is not pinned " +
        (lock_file.empty()
             ? std::string("(no lock file: none given, no TFORMERS_KERNELS_LOCK, "
                           "no ./kernels.lock)")
             : "in " + lock_file + (fs::exists(lock_file) ? "" : " (which does not exist)")) +
        "; pin it with `tformers kernels lock " + id +
        "`, or opt in to unpinned kernels (KernelOptions::allow_unpinned or "
        "TFORMERS_KERNELS_ALLOW_UNPINNED=1)");
  if (pin) {
    if (pin->revision != pkg.revision)
      throw FormatError("kernel " + id + ": " + lock_file + " pins revision " + pin->revision +
                        " but the cache has " + pkg.revision + " (" + pkg.path +
                        "); fetch the pinned revision or re-lock with `tformers kernels lock`");
    if (pin->manifest_sha256 != manifest_sha)
      throw FormatError("kernel " + id + ": " + manifest_path + " has sha256 " + manifest_sha +
                        " but " + lock_file + " pins " + pin->manifest_sha256 +
                        "; the package was modified after it was locked; refusing to load it");
  }

  KernelPlatform platform = KernelPlatform::current();
  platform.backends = {o.device};
  std::vector<VariantCheck> checks = check_variants(pkg.path, platform, m.backends);
  if (checks.empty() || !checks.front().compatible) {
    std::string list;
    for (const auto& c : checks) list += "\n  " + c.name + ": " + c.reason;
    throw UnsupportedError("kernel " + id + " (" + pkg.path + ") has no variant for this " +
                           platform.arch + " " + platform.os + " " + o.device + " (cpu target " +
                           platform.cpu_target +
                           "):" + (list.empty() ? std::string("\n  (build/ is empty)") : list));
  }
  const std::string variant = checks.front().name;

  // Hash every file of the variant; the library's bytes are kept and loaded as they were hashed.
  const fs::path vdir = dir / "build" / variant;
  std::vector<std::string> files = files_under(vdir, dir);
  const std::map<std::string, std::string>* pinned_files = nullptr;
  if (pin) {
    auto it = pin->variants.find(variant);
    if (it == pin->variants.end())
      throw FormatError("kernel " + id + ": variant " + variant + " is not pinned in " + lock_file +
                        " (pinned: " +
                        [&] {
                          std::vector<std::string> v;
                          for (const auto& [name, f] : pin->variants) v.push_back(name);
                          return join(v, ", ");
                        }() +
                        "); re-lock with `tformers kernels lock " + id + "`");
    pinned_files = &it->second;
    for (const auto& [rel, sha] : *pinned_files)
      if (std::find(files.begin(), files.end(), rel) == files.end())
        throw FormatError("kernel " + id + ": " + rel + " is pinned in " + lock_file +
                          " but missing from " + pkg.path);
  }
  std::vector<char> library;
  std::string library_rel, library_sha;
  for (const std::string& rel : files) {
    std::vector<char> bytes = read_file_bytes((dir / rel).string());
    std::string sha = sha256_hex(bytes.data(), bytes.size());
    if (pinned_files) {
      auto it = pinned_files->find(rel);
      if (it == pinned_files->end())
        throw FormatError("kernel " + id + ": " + (dir / rel).string() + " is not pinned in " +
                          lock_file + "; refusing to load a package with unpinned files");
      if (it->second != sha)
        throw FormatError("kernel " + id + ": " + (dir / rel).string() + " has sha256 " + sha +
                          " but " + lock_file + " pins " + it->second +
                          "; the file was modified after it was locked; refusing to load it");
    }
    // The variant's library is the one *.so directly in its folder (check_variants made sure
    // there is exactly one); anything else is data that is pinned but not loaded.
    if (fs::path(rel).extension() == ".so" &&
        fs::path(rel).parent_path() == fs::path("build") / variant) {
      library = std::move(bytes);
      library_rel = rel;
      library_sha = sha;
    }
  }
  TF_CHECK(!library_rel.empty(), "variant without library passed the checks");

  auto impl = std::make_shared<Kernel::Impl>();
  impl->repo_id = repo_id;
  impl->version = version;
  impl->package_version = m.version;
  impl->revision = pkg.revision;
  impl->variant = variant;
  impl->path = pkg.path;
  impl->license = m.license;
  impl->library_sha256 = library_sha;
  impl->pinned = pin != nullptr;
  impl->backend = o.device;
  const std::string where = (dir / library_rel).string();
  impl->handle =
      load_library_bytes(library, repo_id + "@v" + std::to_string(version), where, impl->fd);
  bind_table(*impl, m, where);
  for (const auto& [layer, e] : impl->entries)
    backends::register_kernel(impl->backend, impl->target(layer),
                              reinterpret_cast<const void*>(e.fn), impl);
  return kernels_hub::KernelAccess::wrap(impl);
}

const std::string& Kernel::repo_id() const { return impl_->repo_id; }
int Kernel::version() const { return impl_->version; }
const std::string& Kernel::package_version() const { return impl_->package_version; }
const std::string& Kernel::revision() const { return impl_->revision; }
const std::string& Kernel::variant() const { return impl_->variant; }
const std::string& Kernel::path() const { return impl_->path; }
const std::string& Kernel::license() const { return impl_->license; }
bool Kernel::pinned() const { return impl_->pinned; }
std::vector<std::string> Kernel::layers() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : impl_->entries) out.push_back(name);
  return out;
}
bool Kernel::has_layer(const std::string& layer) const { return impl_->entries.count(layer) != 0; }
const std::string& Kernel::schema(const std::string& layer) const {
  auto it = impl_->entries.find(layer);
  if (it == impl_->entries.end())
    throw NotFoundError("kernel " + describe() + " has no layer '" + layer +
                        "'; it has: " + join(layers(), ", "));
  return it->second.schema_text;
}
std::string Kernel::describe() const {
  return impl_->repo_id + "@v" + std::to_string(impl_->version) + " (" + impl_->package_version +
         ", revision " + impl_->revision + ", variant " + impl_->variant + ")";
}

// ---- Lock files ------------------------------------------------------------------------------

LockFile LockFile::load(const std::string& path) {
  io::Json j = io::load_json_file(path);
  LockFile lock;
  if (!j.is_object()) throw FormatError(path + ": a lock file is a JSON object");
  int64_t lv = io::get_required<int64_t>(j, "lock_version", path);
  if (lv != 1)
    throw FormatError(path + ": lock_version " + std::to_string(lv) +
                      " is not supported (this tformers writes 1)");
  io::Json list = io::get_required<io::Json>(j, "kernels", path);
  if (!list.is_array()) throw FormatError(path + ": 'kernels' must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string w = path + ": kernels[" + std::to_string(i) + "]";
    const io::Json& k = list[i];
    if (!k.is_object()) throw FormatError(w + " must be an object");
    LockEntry e;
    e.repo_id = io::get_required<std::string>(k, "repo_id", w);
    e.version = int(io::get_int_in(k, "version", 0, INT32_MAX, w));
    e.revision = io::get_required<std::string>(k, "revision", w);
    e.manifest_sha256 = io::get_required<std::string>(k, "manifest_sha256", w);
    auto hex64 = [](const std::string& s) {
      return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
             });
    };
    if (!hex64(e.manifest_sha256))
      throw FormatError(w + ".manifest_sha256 must be 64 lower-case hex digits");
    io::Json variants = io::get_required<io::Json>(k, "variants", w);
    if (!variants.is_object()) throw FormatError(w + ".variants must be an object");
    for (const auto& [variant, files] : variants.items()) {
      const std::string wv = w + ".variants." + variant;
      if (!safe_name(variant)) throw FormatError(wv + ": not a variant name");
      if (!files.is_object()) throw FormatError(wv + " must map file paths to sha256 digests");
      for (const auto& [rel, sha] : files.items()) {
        if (!sha.is_string() || !hex64(sha.get<std::string>()))
          throw FormatError(wv + "." + rel + " must be 64 lower-case hex digits");
        if (rel.rfind("build/" + variant + "/", 0) != 0 || rel.find("..") != std::string::npos)
          throw FormatError(wv + ": path '" + rel + "' is not inside build/" + variant + "/");
        e.variants[variant][rel] = sha.get<std::string>();
      }
    }
    lock.upsert(std::move(e));
  }
  return lock;
}

void LockFile::save(const std::string& path) const {
  io::Json list = io::Json::array();
  for (const auto& e : kernels) {
    io::Json variants = io::Json::object();
    for (const auto& [variant, files] : e.variants) variants[variant] = files;
    list.push_back({{"repo_id", e.repo_id},
                    {"version", e.version},
                    {"revision", e.revision},
                    {"manifest_sha256", e.manifest_sha256},
                    {"variants", variants}});
  }
  io::Json j = {{"lock_version", 1}, {"kernels", list}};
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InvalidArgumentError("cannot write lock file " + path);
  out << j.dump(2) << "\n";
  if (!out) throw Error("cannot write lock file " + path);
}

const LockEntry* LockFile::find(const std::string& repo_id, int version) const {
  for (const auto& e : kernels)
    if (e.repo_id == repo_id && e.version == version) return &e;
  return nullptr;
}

void LockFile::upsert(LockEntry entry) {
  for (auto& e : kernels)
    if (e.repo_id == entry.repo_id && e.version == entry.version) {
      e = std::move(entry);
      return;
    }
  kernels.push_back(std::move(entry));
}

LockEntry lock_kernel(const std::string& repo_id, int version, const KernelOptions& o) {
  ResolvedPackage pkg = resolve_kernel_package(repo_id, version, o);
  const fs::path dir = pkg.path;
  const std::string manifest_path = (dir / "manifest.json").string();
  const std::string bytes = read_text(manifest_path);
  Manifest m = parse_manifest(bytes, manifest_path);  // refuse to pin a broken package
  if (m.major != version)
    throw FormatError(manifest_path + ": version " + m.version + " is not major version " +
                      std::to_string(version));
  LockEntry e;
  e.repo_id = repo_id;
  e.version = version;
  e.revision = pkg.revision;
  e.manifest_sha256 = sha256_hex(bytes.data(), bytes.size());
  std::error_code ec;
  for (const auto& v : fs::directory_iterator(dir / "build", ec))
    if (v.is_directory()) {
      const std::string name = v.path().filename().string();
      e.variants[name] = hash_variant(dir, name);
    }
  if (e.variants.empty())
    throw NotFoundError("kernel " + repo_id + "@v" + std::to_string(version) + " (" + pkg.path +
                        ") has no build/<variant>/ folders to pin");
  return e;
}

std::vector<std::string> verify_lock(const LockFile& lock, const KernelOptions& o) {
  std::vector<std::string> problems;
  for (const auto& e : lock.kernels) {
    const std::string id = e.repo_id + "@v" + std::to_string(e.version);
    try {
      LockEntry now = lock_kernel(e.repo_id, e.version, o);
      if (now.revision != e.revision)
        problems.push_back(id + ": the cache has revision " + now.revision + ", the lock pins " +
                           e.revision);
      if (now.manifest_sha256 != e.manifest_sha256)
        problems.push_back(id + ": manifest.json has sha256 " + now.manifest_sha256 +
                           ", the lock pins " + e.manifest_sha256);
      for (const auto& [variant, files] : e.variants) {
        auto it = now.variants.find(variant);
        if (it == now.variants.end()) {
          problems.push_back(id + ": pinned variant " + variant + " is missing");
          continue;
        }
        for (const auto& [rel, sha] : files) {
          auto f = it->second.find(rel);
          if (f == it->second.end())
            problems.push_back(id + ": " + rel + " is missing");
          else if (f->second != sha)
            problems.push_back(id + ": " + rel + " has sha256 " + f->second + ", the lock pins " +
                               sha);
        }
        for (const auto& [rel, sha] : it->second)
          if (!files.count(rel)) problems.push_back(id + ": " + rel + " is not pinned");
      }
      for (const auto& [variant, files] : now.variants)
        if (!e.variants.count(variant))
          problems.push_back(id + ": variant " + variant + " is not pinned");
    } catch (const Error& err) {
      problems.push_back(id + ": " + err.what());
    }
  }
  return problems;
}

}  // namespace tformers
