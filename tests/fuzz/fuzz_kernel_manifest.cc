// A kernel package's manifest.json.
#include "fuzz_util.h"
#include "kernels_hub/package.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  fuzz::expect_ok_or_error([&] {
    kernels_hub::parse_manifest(std::string(reinterpret_cast<const char*>(data), size),
                                "manifest.json");
  });
  return 0;
}
