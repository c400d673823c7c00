// What a hand-written backward receives from check_backward: the inputs it was run on, the
// forward's outputs, the cotangents drawn for them, and a set to put its gradients in.
#pragma once

#include "tilegrad/check/gradient_set.hpp"
#include "tilegrad/core/config.hpp"
#include "tilegrad/grid/launch.hpp"
#include "tilegrad/memory/tensor.hpp"

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tilegrad {

/// The data of one backward call, by the names the forward marked. T is the working dtype.
template <class T>
class backward_context {
public:
  /// An input of the forward (marked in or passive).
  tensor<T const> input(std::string const& name) const { return get(inputs_, name, "input"); }
  /// An output of the forward, as the float forward computed it.
  tensor<T const> output(std::string const& name) const { return get(outputs_, name, "output"); }
  /// The cotangent of an output.
  tensor<T const> cotangent(std::string const& name) const {
    return get(cotangents_, name, "cotangent");
  }
  /// The seed this call's inputs and cotangents were drawn with.
  unsigned seed() const { return seed_; }
  /// The launch options the checker runs with (a backward may use them for its launches).
  launch_options const& options() const { return options_; }

  /// Hands over a gradient (any element type and shape: a wrong one is reported).
  template <class G>
  void set_gradient(std::string const& name, G const& g) {
    gradients_.set(name, g);
  }
  gradient_set& gradients() { return gradients_; }

  // Filled by the checker.
  using named = std::vector<std::pair<std::string, tensor<T const>>>;
  backward_context(named inputs, named outputs, named cotangents, unsigned seed,
                   launch_options options)
      : inputs_(std::move(inputs)), outputs_(std::move(outputs)),
        cotangents_(std::move(cotangents)), seed_(seed), options_(options) {}

private:
  static tensor<T const> get(named const& v, std::string const& name, char const* what) {
    std::string known;
    for (auto const& [n, t] : v) {
      if (n == name)
        return t;
      known += (known.empty() ? "" : ", ") + n;
    }
    throw std::out_of_range("tilegrad::check_backward: no " + std::string(what) + " named '" +
                            name + "' (the forward has: " + known + ")");
  }
  named inputs_, outputs_, cotangents_;
  unsigned seed_;
  launch_options options_;
  gradient_set gradients_;
};

} // namespace tilegrad

#if TILEGRAD_SEPARATE_COMPILATION // compiled in tilegrad/separate.hpp
namespace tilegrad {
extern template class backward_context<float>;
extern template class backward_context<double>;
extern template class backward_context<bf16>;
} // namespace tilegrad
#endif
