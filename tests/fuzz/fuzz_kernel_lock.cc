// A kernels.lock file, loaded and saved back.
#include "fuzz_util.h"
#include "tformers/kernels.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  std::string path = fuzz::write_file("kernels.lock", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_ok_or_error([&] {
    LockFile lock = LockFile::load(path);
    lock.save((fuzz::scratch() / "saved.lock").string());
  });
  return 0;
}
