// Plain attention in double for the attention tests: scores materialised row by row, softmax,
// output and logsumexp, over the keys a predicate keeps. And the message of an invalid_argument.
#pragma once

#include <tilegrad/tilegrad.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_support {

inline double as_double(tilegrad::bf16 v) {
  return static_cast<float>(v);
}
inline double as_double(float v) {
  return v;
}
inline double as_double(double v) {
  return v;
}

/// o (B, H, N, D) and lse (B, H, N), row-major, of softmax(scale q kᵀ) v over the keys j with
/// keep(b, h, i, j); a row that keeps no key has o = 0 and lse = -inf.
template <class T, class Keep>
void reference_attention(tilegrad::owned_tensor<T> const& q, tilegrad::owned_tensor<T> const& k,
                         tilegrad::owned_tensor<T> const& v, double scale, Keep&& keep,
                         std::vector<double>& o, std::vector<double>& lse) {
  std::int64_t const B = q.size(0), H = q.size(1), N = q.size(2), M = k.size(2), D = q.size(3);
  o.assign(static_cast<std::size_t>(B * H * N * D), 0.0);
  lse.assign(static_cast<std::size_t>(B * H * N), -INFINITY);
  std::vector<double> s(static_cast<std::size_t>(M));
  std::vector<std::int64_t> keys;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < N; ++i) {
        keys.clear();
        for (std::int64_t j = 0; j < M; ++j)
          if (keep(b, h, i, j))
            keys.push_back(j);
        if (keys.empty())
          continue;
        double mx = -INFINITY;
        for (std::int64_t j : keys) {
          double acc = 0;
          for (std::int64_t c = 0; c < D; ++c)
            acc += as_double(q.view()(b, h, i, c)) * as_double(k.view()(b, h, j, c));
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (std::int64_t j : keys)
          sum += (s[j] = std::exp(s[j] - mx));
        std::size_t const row = static_cast<std::size_t>((b * H + h) * N + i);
        lse[row] = mx + std::log(sum);
        for (std::int64_t j : keys)
          for (std::int64_t c = 0; c < D; ++c)
            o[row * D + c] += s[j] / sum * as_double(v.view()(b, h, j, c));
      }
}

/// The message of the std::invalid_argument f throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (std::invalid_argument const& e) {
    return e.what();
  }
  return "(no error)";
}

} // namespace test_support
