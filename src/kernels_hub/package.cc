// Schemas, layer contracts, manifests and variant names of kernel packages.
#include "kernels_hub/package.h"

#include <algorithm>
#include <filesystem>

#include "core/cpu_features.h"
#include "io/json.h"
#include "tformers/error.h"

namespace tformers::kernels_hub {

namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kDTypes = {"f32", "bf16", "f16", "i32", "i64"};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (true) {
    size_t end = s.find(sep, begin);
    out.push_back(s.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

bool is_identifier(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

SchemaArg parse_schema_arg(const std::string& text, const std::string& where) {
  size_t colon = text.find(':');
  SchemaArg a;
  a.name = text.substr(0, colon);
  if (colon == std::string::npos || !is_identifier(a.name))
    throw FormatError(where + ": argument '" + text +
                      "' must be NAME:DTYPE[|DTYPE...], e.g. \"weight:f32|bf16\"");
  for (const std::string& d : split(text.substr(colon + 1), '|')) {
    if (std::find(kDTypes.begin(), kDTypes.end(), d) == kDTypes.end())
      throw FormatError(where + ": argument '" + text + "' has dtype '" + d + "'; dtypes are " +
                        join(kDTypes, ", "));
    a.dtypes.push_back(d);
  }
  return a;
}

Schema parse_schema(const std::string& text, const std::string& where) {
  size_t arrow = text.find("->");
  size_t semi = text.find(';');
  if (arrow == std::string::npos || semi == std::string::npos || semi > arrow)
    throw FormatError(where + ": schema '" + text +
                      "' must read INPUTS;ATTRIBUTES->OUTPUT, e.g. "
                      "\"x:f32,weight:f32|bf16;eps:f32->y:f32\"");
  Schema s;
  auto list = [&](const std::string& part, std::vector<SchemaArg>& out) {
    if (part.empty()) return;
    for (const std::string& a : split(part, ',')) out.push_back(parse_schema_arg(a, where));
  };
  list(text.substr(0, semi), s.inputs);
  list(text.substr(semi + 1, arrow - semi - 1), s.attributes);
  s.output = parse_schema_arg(text.substr(arrow + 2), where);
  return s;
}

std::string Schema::str() const {
  auto arg = [](const SchemaArg& a) { return a.name + ":" + join(a.dtypes, "|"); };
  std::string out;
  for (size_t i = 0; i < inputs.size(); ++i) out += (i ? "," : "") + arg(inputs[i]);
  out += ";";
  for (size_t i = 0; i < attributes.size(); ++i) out += (i ? "," : "") + arg(attributes[i]);
  return out + "->" + arg(output);
}

const std::map<std::string, Schema>& layer_contracts() {
  // The arguments tformers passes for each layer, in order, with every dtype it may pass. The
  // graph builder (models/layers.cc) emits custom calls with exactly these inputs and
  // attributes.
  static const std::map<std::string, Schema> contracts = [] {
    std::map<std::string, Schema> c;
    const std::string where = "built-in layer contract";
    // x (..., D), weight (D) -> (..., D); eps.
    c["RMSNorm"] = parse_schema("x:f32,weight:f32|bf16;eps:f32->y:f32", where);
    // silu(gate) * up, elementwise over equal shapes.
    c["SiLUAndMul"] = parse_schema("gate:f32,up:f32;->y:f32", where);
    // x (B,T,H,D) rotated by position_ids (B,T); inv_freq (D/2), rotate-half layout.
    c["RotaryEmbedding"] = parse_schema("x:f32,position_ids:i32;inv_freq:f32->y:f32", where);
    // query (B,T,Hq,D), caches (B,Hkv,S,D), cache_position (), attention_mask (B,S); scale.
    c["Attention"] = parse_schema(
        "query:f32,key_cache:f32|bf16,value_cache:f32|bf16,cache_position:i32,"
        "attention_mask:i32;scale:f32->out:f32",
        where);
    return c;
  }();
  return contracts;
}

std::string check_against_contract(const std::string& layer, const Schema& s) {
  const auto& contracts = layer_contracts();
  auto it = contracts.find(layer);
  if (it == contracts.end()) {
    std::vector<std::string> names;
    for (const auto& [n, c] : contracts) names.push_back(n);
    return "'" + layer + "' is not a layer tformers can replace (layers: " + join(names, ", ") +
           ")";
  }
  const Schema& c = it->second;
  auto args = [](const std::vector<SchemaArg>& v) {
    std::vector<std::string> names;
    for (const auto& a : v) names.push_back(a.name);
    return "(" + join(names, ", ") + ")";
  };
  auto check_list = [&](const char* what, const std::vector<SchemaArg>& got,
                        const std::vector<SchemaArg>& want) -> std::string {
    if (got.size() != want.size())
      return std::string(what) + " " + args(got) + " do not match the contract's " + args(want);
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].name != want[i].name)
        return std::string(what) + " " + args(got) + " do not match the contract's " + args(want) +
               ": argument " + std::to_string(i) + " is '" + got[i].name + "', expected '" +
               want[i].name + "'";
      for (const auto& d : got[i].dtypes)
        if (std::find(want[i].dtypes.begin(), want[i].dtypes.end(), d) == want[i].dtypes.end())
          return std::string(what) + " argument '" + got[i].name + "' accepts " + d +
                 ", which tformers never passes (contract: " + join(want[i].dtypes, "|") + ")";
    }
    return "";
  };
  std::string why = check_list("inputs", s.inputs, c.inputs);
  if (why.empty()) why = check_list("attributes", s.attributes, c.attributes);
  if (why.empty()) why = check_list("output", {s.output}, {c.output});
  if (!why.empty()) why += "; the contract for " + layer + " is \"" + c.str() + "\"";
  return why;
}

std::string modes_str(uint32_t modes) {
  std::vector<std::string> out;
  if (modes & TF_KERNEL_MODE_PREFILL) out.push_back("prefill");
  if (modes & TF_KERNEL_MODE_DECODE) out.push_back("decode");
  return out.empty() ? "none" : join(out, ", ");
}

Manifest parse_manifest(const std::string& bytes, const std::string& where) {
  io::Json j = io::parse_json(bytes, where);
  if (!j.is_object()) throw FormatError(where + ": the manifest must be a JSON object");
  Manifest m;
  m.name = io::get_required<std::string>(j, "name", where);
  m.version = io::get_required<std::string>(j, "version", where);
  m.license = io::get_required<std::string>(j, "license", where);
  size_t used = 0;
  try {
    m.major = std::stoi(m.version, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || m.major < 0 || (used < m.version.size() && m.version[used] != '.'))
    throw FormatError(where + ": version '" + m.version +
                      "' must start with a major version number, e.g. \"1.2.0\"");
  io::Json backends = io::get_required<io::Json>(j, "backends", where);
  if (!backends.is_array() || backends.empty())
    throw FormatError(where + ": 'backends' must be a non-empty list such as [\"cpu\"]");
  for (const auto& b : backends) {
    if (!b.is_string()) throw FormatError(where + ": 'backends' entries must be strings");
    m.backends.push_back(b.get<std::string>());
  }
  io::Json layers = io::get_required<io::Json>(j, "layers", where);
  if (!layers.is_object() || layers.empty())
    throw FormatError(where + ": 'layers' must be an object mapping layer names to schemas");
  for (const auto& [layer, spec] : layers.items()) {
    const std::string w = where + ": layers." + layer;
    if (!spec.is_object()) throw FormatError(w + " must be an object");
    auto strings = [&, &spec = spec](const char* key) {  // clang 14 cannot capture bindings
      std::vector<std::string> out;
      io::Json v = io::get_or<io::Json>(spec, key, io::Json::array(), w);
      if (!v.is_array()) throw FormatError(w + "." + key + " must be a list of strings");
      for (const auto& s : v) {
        if (!s.is_string()) throw FormatError(w + "." + key + " must be a list of strings");
        out.push_back(s.get<std::string>());
      }
      return out;
    };
    ManifestLayer ml;
    for (const auto& a : strings("inputs")) ml.schema.inputs.push_back(parse_schema_arg(a, w));
    for (const auto& a : strings("attributes"))
      ml.schema.attributes.push_back(parse_schema_arg(a, w));
    ml.schema.output = parse_schema_arg(io::get_required<std::string>(spec, "output", w), w);
    if (spec.contains("modes")) {
      ml.modes = 0;
      for (const auto& mode : strings("modes")) {
        if (mode == "prefill")
          ml.modes |= TF_KERNEL_MODE_PREFILL;
        else if (mode == "decode")
          ml.modes |= TF_KERNEL_MODE_DECODE;
        else
          throw FormatError(w + ".modes: '" + mode + "' is not a mode (prefill, decode)");
      }
    }
    if (std::string why = check_against_contract(layer, ml.schema); !why.empty())
      throw FormatError(w + ": the schema does not match the layer: " + why);
    m.layers[layer] = std::move(ml);
  }
  return m;
}

int feature_rank(const std::string& feature) {
  if (feature.empty() || feature == "scalar") return 0;
  for (cpu::Target t :
       {cpu::Target::kAVX2, cpu::Target::kAVX512, cpu::Target::kAVX512BF16, cpu::Target::kAMX})
    if (feature == cpu::target_name(t)) return int(t);
  return -1;
}

bool parse_variant_name(const std::string& name, VariantName& out, std::string& why) {
  std::vector<std::string> parts = split(name, '-');
  if ((parts.size() != 4 && parts.size() != 5) || parts[0].rfind("cabi", 0) != 0) {
    why = "the name does not read cabi<N>-<backend>-<arch>[-<cpu features>]-<os>";
    return false;
  }
  size_t used = 0;
  try {
    out.abi = std::stoi(parts[0].substr(4), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != parts[0].size() - 4) {
    why = "'" + parts[0] + "' is not cabi<N>";
    return false;
  }
  out.backend = parts[1];
  out.arch = parts[2];
  out.feature = parts.size() == 5 ? parts[3] : "";
  out.os = parts.back();
  return true;
}

}  // namespace tformers::kernels_hub

namespace tformers {

using namespace kernels_hub;

KernelPlatform KernelPlatform::current() {
  KernelPlatform p;
#if defined(__linux__)
  p.os = "linux";
#elif defined(__APPLE__)
  p.os = "darwin";
#else
  p.os = "unknown";
#endif
#if defined(__x86_64__)
  p.arch = "x86_64";
#elif defined(__aarch64__)
  p.arch = "aarch64";
#else
  p.arch = "unknown";
#endif
  p.cpu_target = std::string(cpu::target_name(cpu::active_target()));
  p.backends = {"cpu"};
  return p;
}

std::vector<VariantCheck> check_variants(const std::string& package_dir,
                                         const KernelPlatform& platform,
                                         const std::vector<std::string>& backends) {
  const fs::path build = fs::path(package_dir) / "build";
  std::error_code ec;
  if (!fs::is_directory(build, ec))
    throw NotFoundError("kernel package " + package_dir +
                        " has no build/ folder: build/<variant>/ holds one shared library per "
                        "variant, e.g. build/cabi1-cpu-x86_64-avx2-linux/");
  const int have = feature_rank(platform.cpu_target);
  struct Ranked {
    VariantCheck check;
    int rank;
  };
  std::vector<Ranked> all;
  for (const auto& e : fs::directory_iterator(build, ec)) {
    if (!e.is_directory()) continue;
    Ranked r{{e.path().filename().string(), false, ""}, -1};
    VariantName v;
    std::string why;
    auto reject = [&](std::string reason) { r.check.reason = std::move(reason); };
    int libs = 0;
    for (const auto& f : fs::directory_iterator(e.path(), ec))
      if (f.is_regular_file() && f.path().extension() == ".so") ++libs;
    if (!parse_variant_name(r.check.name, v, why)) {
      reject(why);
    } else if (v.abi != TF_KERNEL_ABI_VERSION) {
      reject("built for C ABI version " + std::to_string(v.abi) + ", this tformers speaks " +
             std::to_string(TF_KERNEL_ABI_VERSION));
    } else if (std::find(platform.backends.begin(), platform.backends.end(), v.backend) ==
               platform.backends.end()) {
      reject("backend '" + v.backend +
             "' is not available here (available: " + join(platform.backends, ", ") + ")");
    } else if (!backends.empty() &&
               std::find(backends.begin(), backends.end(), v.backend) == backends.end()) {
      reject("backend '" + v.backend + "' is not among the manifest's backends (" +
             join(backends, ", ") + ")");
    } else if (v.arch != platform.arch) {
      reject("built for " + v.arch + ", this CPU is " + platform.arch);
    } else if (v.os != platform.os) {
      reject("built for " + v.os + ", this system is " + platform.os);
    } else if (feature_rank(v.feature) < 0) {
      reject("unknown CPU feature set '" + v.feature + "' (known: avx2, avx512, avx512bf16, amx)");
    } else if (feature_rank(v.feature) > have) {
      reject("needs " + v.feature + ", but the CPU target here is " + platform.cpu_target);
    } else if (libs != 1) {
      reject(libs == 0 ? "the folder holds no shared library (*.so)"
                       : "the folder holds " + std::to_string(libs) +
                             " shared libraries; a variant has exactly one");
    } else {
      r.check.compatible = true;
      r.rank = feature_rank(v.feature);
      r.check.reason = v.feature.empty() ? "baseline " + v.arch : "uses " + v.feature;
    }
    all.push_back(std::move(r));
  }
  std::sort(all.begin(), all.end(), [](const Ranked& a, const Ranked& b) {
    if (a.check.compatible != b.check.compatible) return a.check.compatible;
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.check.name < b.check.name;
  });
  std::vector<VariantCheck> out;
  for (auto& r : all) out.push_back(std::move(r.check));
  return out;
}

std::map<std::string, std::string> kernel_layer_contracts() {
  std::map<std::string, std::string> out;
  for (const auto& [name, s] : layer_contracts()) out[name] = s.str();
  return out;
}

}  // namespace tformers
