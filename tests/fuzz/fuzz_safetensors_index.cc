// model.safetensors.index.json beside two real shards (names a, b in shard 1; c in shard 2):
// the index must be checked against the shards, and shard names must stay in the folder.
#include "fuzz_util.h"
#include "io/safetensors.h"

namespace {

void write_shards() {
  using tformers::fuzz::write_file;
  auto le64 = [](uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = char(n >> (8 * i));
    return s;
  };
  std::string h1 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";
  std::string h2 = R"({"c":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  write_file("model-00001-of-00002.safetensors", le64(h1.size()) + h1 + std::string(16, '\1'));
  write_file("model-00002-of-00002.safetensors", le64(h2.size()) + h2 + std::string(4, '\2'));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tformers;
  static bool shards = (write_shards(), true);
  (void)shards;
  fuzz::write_file("model.safetensors.index.json", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_ok_or_error([&] {
    io::Checkpoint ck = io::Checkpoint::open(fuzz::scratch().string());
    for (const auto& name : ck.names()) ck.get(name);
  });
  return 0;
}
