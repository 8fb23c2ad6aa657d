#include "kernels_hub/cli.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/paths.h"
#include "kernels_hub/package.h"
#include "kernels_hub/sha256.h"
#include "tformers/error.h"
#include "tformers/kernels.h"

namespace tformers::kernels_hub {

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: tformers kernels list   [--cache DIR]...\n"
    "       tformers kernels lock   [ORG/NAME@vN]... [--lock-file FILE] [--cache DIR]...\n"
    "       tformers kernels verify [--lock-file FILE] [--cache DIR]...\n"
    "  --local ORG/NAME=PATH   use a package folder for one repo (development)\n"
    "  lock with no packages re-pins every entry of the lock file.\n"
    "  The cache is TFORMERS_KERNELS_PATH unless --cache is given; the lock file is\n"
    "  TFORMERS_KERNELS_LOCK, else ./kernels.lock.\n";

std::pair<std::string, int> parse_spec(const std::string& spec) {
  size_t at = spec.find('@');
  std::string v = at == std::string::npos ? "" : spec.substr(at + 1);
  if (!v.empty() && v[0] == 'v') v = v.substr(1);
  size_t used = 0;
  int version = 0;
  try {
    version = std::stoi(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (at == std::string::npos || used == 0 || used != v.size())
    throw InvalidArgumentError("'" + spec +
                               "' is not a kernel spec: use ORG/NAME@vN, e.g. "
                               "tformers-community/fused-norms@v1");
  return {spec.substr(0, at), version};
}

int list(const KernelOptions& o) {
  std::vector<std::string> roots = o.cache_dirs;
  if (roots.empty()) {
    const char* p = std::getenv("TFORMERS_KERNELS_PATH");
    std::string s = p ? p : "";
    size_t begin = 0;
    while (begin < s.size()) {
      size_t end = s.find(':', begin);
      if (end == std::string::npos) end = s.size();
      if (end > begin) roots.push_back(s.substr(begin, end - begin));
      begin = end + 1;
    }
    if (roots.empty()) {
      if (std::string dir = user_cache_dir("kernels"); !dir.empty()) roots.push_back(dir);
    }
  }
  KernelPlatform platform = KernelPlatform::current();
  std::printf("platform: %s %s, cpu target %s\n", platform.arch.c_str(), platform.os.c_str(),
              platform.cpu_target.c_str());
  int found = 0;
  for (const auto& root : roots) {
    std::error_code ec;
    std::vector<fs::path> repos;
    for (const auto& e : fs::directory_iterator(root, ec))
      if (e.is_directory() && e.path().filename().string().rfind("kernels--", 0) == 0)
        repos.push_back(e.path());
    std::sort(repos.begin(), repos.end());
    std::printf("cache %s: %zu package%s\n", root.c_str(), repos.size(),
                repos.size() == 1 ? "" : "s");
    for (const auto& repo : repos) {
      std::string name = repo.filename().string().substr(9);
      size_t sep = name.find("--");
      if (sep == std::string::npos) continue;
      std::string repo_id = name.substr(0, sep) + "/" + name.substr(sep + 2);
      std::vector<fs::path> refs;
      for (const auto& r : fs::directory_iterator(repo / "refs", ec)) refs.push_back(r.path());
      std::sort(refs.begin(), refs.end());
      for (const auto& ref : refs) {
        std::string v = ref.filename().string();
        if (v.size() < 2 || v[0] != 'v') continue;
        ++found;
        KernelOptions one = o;
        one.cache_dirs = {root};
        try {
          // A ref that is not vN (a stray file) is reported like a bad spec, not thrown past.
          int version = parse_spec(repo_id + "@" + v).second;
          ResolvedPackage pkg = resolve_kernel_package(repo_id, version, one);
          std::vector<char> bytes = read_file_bytes(pkg.path + "/manifest.json");
          Manifest m =
              parse_manifest(std::string(bytes.begin(), bytes.end()), pkg.path + "/manifest.json");
          std::string layers;
          for (const auto& [l, ml] : m.layers) layers += (layers.empty() ? "" : ", ") + l;
          std::printf("  %s@%s  %s  revision %s  license %s  layers: %s\n", repo_id.c_str(),
                      v.c_str(), m.version.c_str(), pkg.revision.c_str(), m.license.c_str(),
                      layers.c_str());
          bool first = true;
          for (const auto& c : check_variants(pkg.path, platform, m.backends)) {
            std::printf("    %s %s: %s\n", c.compatible ? (first ? "*" : "+") : "-", c.name.c_str(),
                        c.reason.c_str());
            if (c.compatible) first = false;
          }
        } catch (const Error& e) {
          std::printf("  %s@%s  error: %s\n", repo_id.c_str(), v.c_str(), e.what());
        }
      }
    }
  }
  if (found) std::printf("(* picked, + compatible, - rejected)\n");
  return 0;
}

}  // namespace

int kernels_cli(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "-h" || args[0] == "--help") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string cmd = args[0];
  KernelOptions o;
  std::vector<std::string> specs;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw InvalidArgumentError(a + " needs a value\n" + kUsage);
      return args[++i];
    };
    if (a == "--cache") {
      o.cache_dirs.push_back(value());
    } else if (a == "--lock-file") {
      o.lock_file = value();
    } else if (a == "--local") {
      std::string v = value();
      size_t eq = v.find('=');
      if (eq == std::string::npos)
        throw InvalidArgumentError("--local '" + v + "' must be ORG/NAME=PATH");
      o.local_overrides[v.substr(0, eq)] = v.substr(eq + 1);
    } else if (!a.empty() && a[0] == '-') {
      throw InvalidArgumentError("unknown option '" + a + "'\n" + kUsage);
    } else {
      specs.push_back(a);
    }
  }
  if (cmd == "list") return list(o);
  std::string lock_path = o.lock_file;
  if (lock_path.empty()) {
    const char* env = std::getenv("TFORMERS_KERNELS_LOCK");
    lock_path = env && *env ? env : "kernels.lock";
  }
  if (cmd == "lock") {
    std::error_code ec;
    LockFile lock;
    if (fs::exists(lock_path, ec)) lock = LockFile::load(lock_path);
    std::vector<std::pair<std::string, int>> todo;
    for (const auto& s : specs) todo.push_back(parse_spec(s));
    if (todo.empty())
      for (const auto& e : lock.kernels) todo.push_back({e.repo_id, e.version});
    if (todo.empty())
      throw InvalidArgumentError("nothing to lock: name packages (ORG/NAME@vN) or keep them in " +
                                 lock_path);
    for (const auto& [repo, version] : todo) {
      LockEntry e = lock_kernel(repo, version, o);
      size_t files = 0;
      for (const auto& [v, f] : e.variants) files += f.size();
      std::printf("locked %s@v%d revision %s: %zu variant%s, %zu file%s\n", repo.c_str(), version,
                  e.revision.c_str(), e.variants.size(), e.variants.size() == 1 ? "" : "s", files,
                  files == 1 ? "" : "s");
      lock.upsert(std::move(e));
    }
    lock.save(lock_path);
    std::printf("wrote %s\n", lock_path.c_str());
    return 0;
  }
  if (cmd == "verify") {
    std::error_code ec;
    if (!fs::exists(lock_path, ec))
      throw NotFoundError("no lock file " + lock_path +
                          ": write one with `tformers kernels lock ORG/NAME@vN`, or name one "
                          "with --lock-file");
    LockFile lock = LockFile::load(lock_path);
    std::vector<std::string> problems = verify_lock(lock, o);
    for (const auto& p : problems) std::printf("MISMATCH %s\n", p.c_str());
    if (!problems.empty()) {
      std::printf("%zu problem%s in %s\n", problems.size(), problems.size() == 1 ? "" : "s",
                  lock_path.c_str());
      return 1;
    }
    std::printf("%zu kernel%s verified against %s\n", lock.kernels.size(),
                lock.kernels.size() == 1 ? "" : "s", lock_path.c_str());
    return 0;
  }
  throw InvalidArgumentError("unknown kernels command '" + cmd + "'\n" + kUsage);
}

}  // namespace tformers::kernels_hub
