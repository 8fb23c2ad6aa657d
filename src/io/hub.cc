#include "io/hub.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <vector>

#include "core/std_errors.h"
#include "io/file.h"
#include "tformers/error.h"

namespace tformers::io {

namespace fs = std::filesystem;
using detail::str_cat;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string home_dir() {
  std::string h = env("HOME");
  if (!h.empty()) return h;
  if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) return pw->pw_dir;
  return "/";
}

// huggingface_hub expands "~" in the cache variables; so do we.
std::string expand_user(const std::string& p) {
  if (p == "~") return home_dir();
  if (p.rfind("~/", 0) == 0) return home_dir() + p.substr(1);
  return p;
}

// The single cache folder huggingface_hub would use, with the reason it was chosen.
std::pair<std::string, std::string> hub_cache_root() {
  if (std::string v = env("HF_HUB_CACHE"); !v.empty()) return {expand_user(v), "$HF_HUB_CACHE"};
  if (std::string v = env("HUGGINGFACE_HUB_CACHE"); !v.empty())
    return {expand_user(v), "$HUGGINGFACE_HUB_CACHE (legacy name of HF_HUB_CACHE)"};
  if (std::string v = env("HF_HOME"); !v.empty())
    return {(fs::path(expand_user(v)) / "hub").string(), "$HF_HOME/hub"};
  if (std::string v = env("XDG_CACHE_HOME"); !v.empty())
    return {(fs::path(expand_user(v)) / "huggingface" / "hub").string(),
            "$XDG_CACHE_HOME/huggingface/hub"};
  return {(fs::path(home_dir()) / ".cache" / "huggingface" / "hub").string(),
          "the default ~/.cache/huggingface/hub"};
}

bool valid_id_part(const std::string& s) {
  if (s.empty() || s.size() > 96) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  if (s.find("--") != std::string::npos || s.find("..") != std::string::npos) return false;
  return s.front() != '-' && s.front() != '.' && s.back() != '-' && s.back() != '.';
}

// Hub ids as huggingface_hub validates them: "name" or "org/name" of [A-Za-z0-9_.-], no "--"
// or "..", not starting or ending with '-' or '.'. This also keeps the id from naming a path
// outside the cache.
bool valid_repo_id(const std::string& id) {
  size_t slash = id.find('/');
  if (slash == std::string::npos) return valid_id_part(id);
  return valid_id_part(id.substr(0, slash)) && valid_id_part(id.substr(slash + 1));
}

// A revision is a branch, tag or commit hash; branches may contain '/' (refs/pr/1), but no
// component may leave the refs or snapshots folder.
bool valid_revision(const std::string& rev) {
  if (rev.empty() || rev.front() == '/' || rev.back() == '/' || rev.size() > 256) return false;
  std::stringstream ss(rev);
  for (std::string part; std::getline(ss, part, '/');)
    if (part.empty() || part == "." || part == "..") return false;
  for (char c : rev)
    if (static_cast<unsigned char>(c) < 0x20 || c == '\\') return false;
  return true;
}

bool valid_commit(const std::string& c) {
  return !c.empty() && c.size() <= 128 && c.find('/') == std::string::npos &&
         c.find('\\') == std::string::npos && c != "." && c != "..";
}

std::string list_dir(const fs::path& p, bool dirs_only) {
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::recursive_directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
    if (dirs_only) {
      it.disable_recursion_pending();
      if (it->is_directory(ec)) names.push_back(it->path().filename().string());
    } else if (it->is_regular_file(ec)) {
      names.push_back(fs::relative(it->path(), p, ec).string());
    }
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 8) out += ", ...";
  return out;
}

}  // namespace

std::string resolve_model_path(const std::string& id_or_path, const std::string& revision) {
  return detail::with_tformers_errors(str_cat("finding model ", id_or_path), [&] {
    if (id_or_path.empty())
      throw InvalidArgumentError("model id or path is empty: pass a model folder or a Hub id");
    std::error_code ec;
    if (fs::is_directory(id_or_path, ec)) return id_or_path;
    std::string local = fs::absolute(id_or_path, ec).string();
    if (fs::exists(id_or_path, ec))
      throw NotFoundError(str_cat("'", id_or_path, "' is a file; pass the model folder that holds ",
                                  "config.json and the weights"));
    if (!valid_repo_id(id_or_path))
      throw NotFoundError(str_cat(
          "model '", id_or_path, "' not found: there is no folder ", local,
          ", and it is not a valid Hugging Face Hub id ('org/name' or 'name' of letters, digits, "
          "'-', '_' and '.', without '--' or '..')"));
    if (!valid_revision(revision))
      throw InvalidArgumentError(str_cat("revision '", revision, "' for model '", id_or_path,
                                         "' is not a valid branch, tag or commit name"));

    auto [root, root_why] = hub_cache_root();
    std::string folder = "models--" + id_or_path;
    for (size_t p; (p = folder.find('/')) != std::string::npos;) folder.replace(p, 1, "--");
    fs::path repo = fs::path(root) / folder;
    fs::path ref_file = repo / "refs" / revision;

    std::vector<std::string> looked;
    looked.push_back(str_cat(local, " (as a local folder): does not exist"));
    std::string hint;
    if (!fs::is_directory(repo, ec)) {
      looked.push_back(str_cat(repo.string(), " (Hub cache from ", root_why, "): does not exist"));
    } else {
      std::string commit;
      if (fs::is_regular_file(ref_file, ec)) {
        // A ref holds one commit hash; the cap keeps a corrupt one from being read whole.
        commit = read_regular_file(ref_file.string(), 4096, "Hub ref file");
        commit = commit.substr(0, commit.find('\n'));
        while (!commit.empty() && std::isspace(static_cast<unsigned char>(commit.back())))
          commit.pop_back();
        if (!valid_commit(commit))
          throw FormatError(str_cat(ref_file.string(), ": expected a commit hash, got '", commit,
                                    "'; the Hub cache is corrupt: download the model again"));
        fs::path snap = repo / "snapshots" / commit;
        if (fs::is_directory(snap, ec)) return snap.string();
        looked.push_back(str_cat(ref_file.string(), ": points at commit ", commit));
        looked.push_back(str_cat(snap.string(), ": does not exist (incomplete download?)"));
      } else {
        looked.push_back(str_cat(ref_file.string(), " (revision '", revision,
                                 "' as a branch or tag): does not exist"));
        fs::path snap = repo / "snapshots" / revision;
        if (revision.find('/') == std::string::npos && fs::is_directory(snap, ec))
          return snap.string();
        looked.push_back(str_cat(snap.string(), " (revision '", revision,
                                 "' as a commit hash): does not exist"));
      }
      std::string refs = list_dir(repo / "refs", false);
      std::string snaps = list_dir(repo / "snapshots", true);
      hint = str_cat("; the cache has refs [", refs, "] and snapshots [", snaps,
                     "]: pass one with --revision");
    }
    std::string msg =
        str_cat("model '", id_or_path, "' (revision '", revision, "') not found. Looked in:");
    for (const auto& l : looked) msg += "\n  - " + l;
    msg += str_cat(
        "\nThe Hub cache is chosen like huggingface_hub does: $HF_HUB_CACHE, else $HF_HOME/hub, "
        "else ~/.cache/huggingface/hub (here: ",
        root, ")", hint,
        ".\ntformers never downloads: fetch the model with `huggingface-cli download ", id_or_path,
        "` where there is network access, point HF_HUB_CACHE or HF_HOME at the cache that has "
        "it, or pass a local folder.");
    throw NotFoundError(msg);
  });
}

}  // namespace tformers::io
