// What a user's first check file looks like (the README's softmax, its hand-written backward and
// one check_backward in a GoogleTest test): the file whose compile time bench/compile/time.sh
// reports. Not built by CMake.
#include <tilegrad/check/gtest.hpp>
#include <tilegrad/tilegrad.hpp>
#include <gtest/gtest.h>
#include <cmath>
namespace tg = tilegrad;
template <int Block>
constexpr auto softmax_fwd = []<class T>(tg::program const& p, tg::tensor<T const> x,
                                         tg::tensor<T> y) {
  auto const cols = tg::arange<0, Block>();
  auto const mask = cols < x.size(1);
  auto const row = tg::load(x + p.program_id(0) * x.stride(0) + cols, mask, -INFINITY);
  auto const num = tg::exp(row - tg::max(row));
  tg::tile<T, Block> const out = num / tg::sum(num);
  tg::store(y + p.program_id(0) * y.stride(0) + cols, out, mask);
};
template <int Block>
constexpr auto softmax_bwd = []<class T>(tg::program const& p, tg::tensor<T const> y,
                                         tg::tensor<T const> dy, tg::tensor<T> dx) {
  auto const cols = tg::arange<0, Block>();
  auto const mask = cols < y.size(1);
  auto const yr = tg::load(y + p.program_id(0) * y.stride(0) + cols, mask, 0.0f);
  auto const gr = tg::load(dy + p.program_id(0) * dy.stride(0) + cols, mask, 0.0f);
  tg::store(dx + p.program_id(0) * dx.stride(0) + cols, yr * (gr - tg::sum(gr * yr)), mask);
};
TEST(Softmax, Backward) {
  std::int64_t const n = 300, d = 100;
  tg::owned_tensor<float> x({n, d}), y({n, d});
  auto fwd = tg::forward(tg::grid(n), softmax_fwd<128>, tg::in("x", x), tg::out("y", y));
  EXPECT_TRUE(tg::check_backward(fwd, [](tg::backward_context<float>& ctx) {
    auto const yv = ctx.output("y");
    tg::owned_tensor<float> dx({yv.size(0), yv.size(1)});
    tg::launch(ctx.options(), tg::grid(yv.size(0)), softmax_bwd<128>, yv, ctx.cotangent("y"),
               dx.view());
    return tg::gradient_set{{"x", dx}};
  }));
}
