// generation_config.json through the public reader.
#include "fuzz_util.h"
#include "tformers/generation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  std::string path =
      fuzz::write_file("generation_config.json", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_ok_or_error([&] { GenerationConfig::from_file(path); });
  return 0;
}
