// Mutates the header of a valid file at random (fixed seed) and checks that opening and reading
// it either works or throws a tformers::Error: never a crash, a hang or another exception. The
// asan preset runs this under AddressSanitizer and UndefinedBehaviorSanitizer.
#include <gtest/gtest.h>

#include <random>

#include "io/io_test_util.h"
#include "io/safetensors.h"

namespace tformers::io {
namespace {

using testing::TempDir;

// Reads every byte of every tensor, so a bad offset that slipped through would fault.
uint64_t touch_all(const SafetensorsFile& f) {
  uint64_t sum = 0;
  for (const auto& info : f.tensors()) {
    Tensor t = f.get(info.name);
    const auto* p = static_cast<const uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
    if (t.ndim() > 0 && t.dim(0) > 0) sum += f.get_rows(info.name, 0, 1).nbytes();
  }
  return sum;
}

TEST(Fuzz, MutatedHeadersOnlyThrowErrors) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  save_safetensors(
      path,
      {{"a", Tensor::from_vector({2, 3}, DType::f32, std::vector<float>(v.begin(), v.begin() + 6))},
       {"b", Tensor::from_vector<float>({4, 3}, DType::f32, std::vector<float>(12, 1.f))
                 .to(DType::bf16)},
       {"c",
        Tensor::from_vector<float>({5}, DType::f32, std::vector<float>(5, 2.f)).to(DType::f16)},
       {"d", Tensor::from_vector<int64_t>({1}, DType::i64, {7})}},
      {{"format", "pt"}});
  const std::string good = testing::read_bytes(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | uint8_t(good[i]);

  std::mt19937_64 rng(20261129);
  const std::string alphabet = "{}[]\",:0123456789-+.eE \\FIUBabcdsh_\x00\xff";
  auto pick = [&](size_t n) { return size_t(rng() % n); };
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string bytes = good;
    std::string header = bytes.substr(8, header_len);
    std::string data = bytes.substr(8 + header_len);
    int mutations = 1 + int(pick(4));
    bool fix_length = pick(4) != 0;  // mostly keep the length consistent to reach validation
    for (int m = 0; m < mutations && !header.empty(); ++m) {
      size_t at = pick(header.size());
      switch (pick(6)) {
        case 0:
          header[at] = char(rng());
          break;
        case 1:
          header[at] = alphabet[pick(alphabet.size())];
          break;
        case 2:
          header.erase(at, 1 + pick(3));
          break;
        case 3:
          header.insert(at, 1, alphabet[pick(alphabet.size())]);
          break;
        case 4: {  // replace a digit run with a random number, often an offset or a dim
          const char* nums[] = {"0",
                                "1",
                                "4",
                                "999999999999",
                                "18446744073709551615",
                                "18446744073709551616",
                                "-1",
                                "1e3",
                                "3.5",
                                "9223372036854775807"};
          size_t b = header.find_first_of("0123456789", at);
          if (b == std::string::npos) break;
          size_t e = header.find_first_not_of("0123456789", b);
          header.replace(b, e - b, nums[pick(std::size(nums))]);
          break;
        }
        case 5:
          data.resize(pick(data.size() + 8));
          break;  // truncate or pad the data
      }
    }
    uint64_t len = fix_length ? header.size() : rng() % (header.size() + 64);
    if (pick(50) == 0) len = rng();
    // A fresh file each time: truncating one in place makes ext4 flush it to disk (slow).
    std::filesystem::remove(path);
    testing::write_bytes(path, testing::le64(len) + header + data);
    try {
      auto f = SafetensorsFile::open(path);
      touch_all(*f);
      ++opened;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-tformers exception " << e.what();
    }
  }
  // The mutations must exercise both outcomes, or the test proves nothing.
  EXPECT_GT(opened, 10);
  EXPECT_GT(rejected, 1000);
  std::cout << "opened " << opened << ", rejected " << rejected << "\n";
}

}  // namespace
}  // namespace tformers::io
