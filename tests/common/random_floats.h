// Reproducible test data: n floats drawn uniformly from [-bound, bound) by a seeded mt19937.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace tformers::testing {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float bound = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-bound, bound);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace tformers::testing
