// A whole safetensors file: length, header, data. Opening must validate everything that reading
// a tensor relies on, so every tensor the header lists is then read.
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  std::string path =
      fuzz::write_file("model.safetensors", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_ok_or_error([&] {
    auto file = io::SafetensorsFile::open(path);
    for (const auto& t : file->tensors()) {
      Tensor x = file->get(t.name);
      if (!t.shape.empty() && t.shape[0] > 0) file->get_rows(t.name, 0, 1);
    }
  });
  return 0;
}
