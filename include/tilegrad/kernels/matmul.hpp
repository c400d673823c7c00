// Matrix product C = A @ B, the Triton tutorial kernel: BM x BN output tiles walked in groups
// of GroupM rows of tiles (for cache reuse), K in steps of BK, masked at the K edge, dot with
// an fp32 accumulator.
#pragma once

#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/pointer.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/dot.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/shape_ops.hpp"

#include <algorithm>
#include <utility>

namespace tilegrad::kernels {

/// c = a @ b for a (M, K), b (K, N), c (M, N). Grid: cdiv(M, BM) * cdiv(N, BN) programs.
template <int BM, int BN, int BK, int GroupM = 8>
inline constexpr auto matmul_fwd = []<class T>(program const& p, tensor<T const> a,
                                               tensor<T const> b, tensor<T> c) {
  int const M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1));
  int const N = static_cast<int>(b.size(1));
  // Grouped ordering: consecutive programs share rows of A and columns of B.
  int const pid = p.program_id(0);
  int const num_pid_m = cdiv(M, BM), num_pid_n = cdiv(N, BN);
  int const num_pid_in_group = GroupM * num_pid_n;
  int const group_id = pid / num_pid_in_group;
  int const first_pid_m = group_id * GroupM;
  int const group_size_m = std::min(num_pid_m - first_pid_m, GroupM);
  int const pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m;
  int const pid_n = (pid % num_pid_in_group) / group_size_m;

  // Rows and columns past the edge wrap around (% M, % N): their loads stay inside and their
  // results are masked at the store.
  auto const offs_am = (pid_m * BM + arange<0, BM>()) % M;
  auto const offs_bn = (pid_n * BN + arange<0, BN>()) % N;
  auto const offs_k = arange<0, BK>();
  auto a_ptrs = a + (col(offs_am) * a.stride(0) + row(offs_k) * a.stride(1));
  auto b_ptrs = b + (col(offs_k) * b.stride(0) + row(offs_bn) * b.stride(1));

  auto acc = zeros<fp32<T>, BM, BN>();
  for (int k = 0; k < cdiv(K, BK); ++k) {
    auto const a_tile = load(a_ptrs, row(offs_k) < K - k * BK, 0.0f);
    auto const b_tile = load(b_ptrs, col(offs_k) < K - k * BK, 0.0f);
    acc = dot(a_tile, b_tile, std::move(acc)); // accumulates in place
    a_ptrs += BK * a.stride(1);
    b_ptrs += BK * b.stride(0);
  }

  auto const offs_cm = pid_m * BM + arange<0, BM>();
  auto const offs_cn = pid_n * BN + arange<0, BN>();
  store(c + (col(offs_cm) * c.stride(0) + row(offs_cn) * c.stride(1)), acc,
        (col(offs_cm) < M) & (row(offs_cn) < N));
};

} // namespace tilegrad::kernels
