#include "generation/speculative.h"

#include <cmath>
#include <limits>
#include <vector>

#include "tformers/error.h"

namespace tformers::generation {

namespace {

// softmax(scores) in double; -inf scores weigh 0.
std::vector<double> probabilities(std::span<const float> scores) {
  double m = -std::numeric_limits<double>::infinity();
  for (float s : scores) m = std::max(m, double(s));
  std::vector<double> p(scores.size(), 0.0);
  if (!std::isfinite(m)) return p;
  double total = 0;
  for (size_t i = 0; i < scores.size(); ++i)
    total += p[i] = std::isinf(scores[i]) ? 0.0 : std::exp(double(scores[i]) - m);
  for (double& v : p) v /= total;
  return p;
}

}  // namespace

int32_t speculative_choice(std::span<const float> p_scores, std::span<const float> q_scores,
                           int32_t proposed, Sampler& sampler) {
  TF_CHECK(
      p_scores.size() == q_scores.size() && proposed >= 0 && size_t(proposed) < p_scores.size(),
      "speculative_choice: scores of ", p_scores.size(), " and ", q_scores.size(),
      " tokens, proposal ", proposed);
  const std::vector<double> p = probabilities(p_scores), q = probabilities(q_scores);
  const double ratio = q[size_t(proposed)] > 0 ? p[size_t(proposed)] / q[size_t(proposed)] : 0.0;
  if (sampler.next_uniform() < ratio) return proposed;
  // The residual max(0, p - q) as scores (its log; -inf where it is 0) for the sampler to draw
  // from. It is 0 everywhere only when p = q, where every proposal is kept; rounding may still
  // leave it so, and then p itself is drawn from.
  std::vector<float> residual(p.size());
  bool any = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const double r = p[i] - q[i];
    residual[i] = r > 0 ? float(std::log(r)) : -std::numeric_limits<float>::infinity();
    any = any || r > 0;
  }
  return any ? sampler.sample(residual) : sampler.sample(p_scores);
}

}  // namespace tformers::generation
