// config.json through the public loader, in a folder without weights: every config either fails
// with a tformers::Error or reaches the missing weights (also a tformers::Error). Nothing the
// config says may allocate, loop or overflow before that.
#include "fuzz_util.h"
#include "tformers/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  fuzz::write_file("config.json", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_ok_or_error([] { AutoModelForCausalLM::from_pretrained(fuzz::scratch().string()); });
  return 0;
}
